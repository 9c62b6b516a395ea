#!/usr/bin/env python3
"""Sum ncu's per-kernel durations by kernel name: where the time of a decode step goes.

    ktime.py NCU_CSV N_TOKENS [OTHER_NCU_CSV ...]

NCU_CSV is the stdout of `ncu --csv --print-units base --metrics gpu__time_duration.sum <program>` (the
program's own output may be mixed in; only ncu's quoted CSV lines are read). Prints, per kernel name (template
arguments cut), the launches and microseconds per token, largest first, then the totals.
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


def read(path: str) -> dict[str, list[float]]:
    with open(path, errors="replace") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    if not lines:
        raise SystemExit(f"{path}: no ncu CSV lines (did ncu run?)")
    rows = csv.DictReader(lines)
    per: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))   # ns with --print-units base
        per[short_name(r["Kernel Name"])].append(value / 1000.0)
    return per


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__)
        return 2
    n_tok = float(argv[2])
    for path in [argv[1], *argv[3:]]:
        per = read(path)
        total_n = sum(len(v) for v in per.values())
        total_us = sum(sum(v) for v in per.values())
        print(f"== {path}: {total_n/n_tok:.0f} launches, {total_us/n_tok:.1f} us of kernel time per token")
        for name, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {len(v)/n_tok:7.1f} x  {sum(v)/n_tok:8.1f} us/token  (mean {sum(v)/len(v):6.2f} us)  {name[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
