#!/usr/bin/env python3
"""Sum ncu's per-kernel durations by kernel name: where the time of a decode step goes.

    ktime.py [--last-steps K] NCU_CSV N_TOKENS [OTHER_NCU_CSV ...]

NCU_CSV is the stdout of `ncu --csv --print-units base --metrics gpu__time_duration.sum <program>` (the
program's own output may be mixed in; only ncu's quoted CSV lines are read). Prints, per kernel name (template
arguments cut), the launches and microseconds per token, largest first, then the totals.

--last-steps K keeps only the last K graph evaluations of the run (e.g. the decode steps after a prefill): the
shortest period P with which the run's last K*P kernel names repeat, K times (a decode step's graph launches the
same kernels every step; the prefill's differ). N_TOKENS is then the tokens of those K steps.
"""
import csv
import sys
from collections import defaultdict


def short_name(name: str) -> str:
    for cut in ("<", "("):
        i = name.find(cut)
        if i > 0:
            name = name[:i]
    return name.replace("void ", "").strip()


def read(path: str, last_steps: int = 0) -> dict[str, list[float]]:
    with open(path, errors="replace") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    if not lines:
        raise SystemExit(f"{path}: no ncu CSV lines (did ncu run?)")
    launches = [(short_name(r["Kernel Name"]), float(r["Metric Value"].replace(",", "")) / 1000.0)   # ns -> us
                for r in csv.DictReader(lines) if r.get("Metric Name") == "gpu__time_duration.sum"]
    if last_steps > 0:
        names = [name for name, _ in launches]
        period = next((p for p in range(1, len(names) // last_steps + 1)
                       if all(names[-p * (k + 1):len(names) - p * k] == names[-p:] for k in range(1, last_steps))), 0)
        if not period:
            raise SystemExit(f"{path}: the last launches do not repeat {last_steps} times")
        print(f"{path}: the last {last_steps} steps, {period} launches each")
        launches = launches[-period * last_steps:]
    per: dict[str, list[float]] = defaultdict(list)
    for name, us in launches:
        per[name].append(us)
    return per


def main(argv: list[str]) -> int:
    last_steps = 0
    if len(argv) > 2 and argv[1] == "--last-steps":
        last_steps = int(argv[2])
        argv = [argv[0], *argv[3:]]
    if len(argv) < 3:
        print(__doc__)
        return 2
    n_tok = float(argv[2])
    for path in [argv[1], *argv[3:]]:
        per = read(path, last_steps)
        total_n = sum(len(v) for v in per.values())
        total_us = sum(sum(v) for v in per.values())
        print(f"== {path}: {total_n/n_tok:.0f} launches, {total_us/n_tok:.1f} us of kernel time per token")
        for name, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {len(v)/n_tok:7.1f} x  {sum(v)/n_tok:8.1f} us/token  (mean {sum(v)/len(v):6.2f} us)  {name[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
