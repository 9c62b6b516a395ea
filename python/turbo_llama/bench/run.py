"""`turbo-llama bench`: llama-bench prompt processing / generation speed per KV-cache type and depth.

Outputs (in --out): bench.json (raw llama-bench records + commands), bench.md (t/s and ratio to
f16), bench.png (t/s vs depth, one line per type; pp and tg panels).

--rounds N runs the whole sweep over the types N times, one type after another in every round, so that a
slow drift of the machine (clocks, temperature, a neighbour) falls on all types alike: each round's ratios
are taken against f16 of the same round, and the table shows the median t/s and the median ratio with the
range of the rounds' ratios.

A type may carry environment switches for that type's llama-bench runs only, `TYPE+NAME=VALUE[+NAME=VALUE]`
(e.g. `--types f16,turbo3,turbo3+TURBO_PDL=1`): a kernel variant then sits in the same rounds as the default,
which is the comparison that the machine's drift does not blur. A cache may be a K/V pair (`q8_0/turbo3`).

The outputs are written into <out>.partial and renamed to <out> at the end (also when interrupted:
status "interrupted" in bench.json, the finished rows in bench.md); a type that fails is reported with
llama-bench's reason and makes the command exit 1.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shlex
import statistics
from pathlib import Path

import click

from ..build.installed import find_tool
from ..cache_types import check_caches, parse_cache, supported_types
from ..errors import ToolError
from ..eval import processes
from ..eval.llama_tools import check_unsupported, tool_reason, tool_version
from ..eval.outputs import finishing, staging_dir
from .shapes import RANDOM_WEIGHTS_WARNING, SHAPES


def bench_cmd(exe: Path, model: Path, cache_type: str, depths: list[int], p: int, n: int, backend: str,
              threads: int, reps: int, repack: bool) -> list[str]:
    cmd = [str(exe), "-m", str(model), "-fa", "1", *parse_cache(cache_type).args(),
           "-d", ",".join(map(str, depths)), "-p", str(p), "-n", str(n), "-r", str(reps),
           "-ngl", "99" if backend == "cuda" else "0", "-t", str(threads), "-o", "json"]
    if not repack:
        cmd += ["--repack", "0"]
    return cmd


_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*$")


def parse_type_spec(spec: str) -> tuple[str, dict[str, str]]:
    """'turbo3+TURBO_PDL=1+TURBO_FA_MMA=9' -> ('turbo3', {'TURBO_PDL': '1', 'TURBO_FA_MMA': '9'}); a plain type has no
    switches. ValueError, naming the spec, for anything else."""
    cache_type, *switches = spec.split("+")
    env = {}
    for sw in switches:
        name, eq, value = sw.partition("=")
        if not eq or not _ENV_NAME.match(name) or name in env:
            break
        env[name] = value
    if not cache_type or len(env) != len(switches):
        raise ValueError(f"cache type {spec!r}: expected TYPE or TYPE+NAME=VALUE[+NAME=VALUE...] "
                         "(NAME an environment variable in capitals, each once)")
    return cache_type, env


def parse_bench_json(text: str) -> list[dict]:
    """llama-bench -o json records → rows {type, test ('pp'/'tg'), label, n, depth, tps, tps_std}."""
    start = text.find("[")
    if start < 0:
        raise ValueError("no JSON array in llama-bench output")
    recs = json.loads(text[start: text.rindex("]") + 1])
    rows = []
    for r in recs:
        test = "pp" if r["n_prompt"] > 0 and r["n_gen"] == 0 else "tg" if r["n_gen"] > 0 and r["n_prompt"] == 0 else "pg"
        n = r["n_prompt"] if test == "pp" else r["n_gen"]
        rows.append({"type": r["type_k"] if r["type_k"] == r["type_v"] else f'{r["type_k"]}/{r["type_v"]}',
                     "test": test, "label": f"{test}{n}", "n": n, "depth": r.get("n_depth", 0),
                     "tps": r["avg_ts"], "tps_std": r.get("stddev_ts")})
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Rows of one or more rounds (key "round", absent = 0) -> one row per (type, test, depth): tps the median
    over the rounds, ratio the median of the rounds' ratios to f16 of the same round (ratio_min/ratio_max their
    range), round_tps the t/s of each round."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["type"], r["test"], r["depth"]), []).append(r)
    f16 = {(r["test"], r["depth"], r.get("round", 0)): r["tps"] for r in rows if r["type"] == "f16"}
    out = []
    for (t, test, depth), rs in groups.items():
        rs = sorted(rs, key=lambda r: r.get("round", 0))
        row = {k: rs[0][k] for k in ("type", "test", "label", "n", "depth") if k in rs[0]}
        row["tps"] = statistics.median(r["tps"] for r in rs)
        row["tps_std"] = rs[0].get("tps_std") if len(rs) == 1 else statistics.pstdev(r["tps"] for r in rs)
        row["round_tps"] = [r["tps"] for r in rs]
        ratios = [r["tps"] / f16[(test, depth, r.get("round", 0))] for r in rs
                  if (test, depth, r.get("round", 0)) in f16] if t != "f16" else []
        if ratios:
            row.update(ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios))
        out.append(row)
    return out


def render_table(rows: list[dict], types: list[str]) -> str:
    """Markdown table of t/s per type and (test, depth), with the ratio to f16 (of the same round: `summarize`);
    where a row has several rounds, the ratio's range follows it."""
    rows = summarize(rows)
    keys = sorted({(r["test"], r["label"], r["depth"]) for r in rows}, key=lambda k: (k[0] != "pp", k[2]))
    by = {(r["type"], r["test"], r["depth"]): r for r in rows}
    present = [t for t in types if any(r["type"] == t for r in rows)]
    head = "| test | depth | " + " | ".join(f"{t} t/s" + ("" if t == "f16" else " (×f16)") for t in present) + " |"
    lines = [head, "|" + "---|" * (2 + len(present))]
    for test, label, depth in keys:
        cells = []
        for t in present:
            r = by.get((t, test, depth))
            if r is None:
                cells.append("–")
            elif "ratio" not in r:
                cells.append(f"{r['tps']:.2f}")
            elif len(r["round_tps"]) > 1:
                cells.append(f"{r['tps']:.2f} ({r['ratio']:.3f}, {r['ratio_min']:.3f}-{r['ratio_max']:.3f})")
            else:
                cells.append(f"{r['tps']:.2f} ({r['ratio']:.3f})")
        lines.append(f"| {label} | {depth} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_bench(*, model_path: Path, random_shape: str | None, types: list[str], depths: list[int], p: int,
              n: int, backend: str, threads: int, reps: int, repack: bool, out: Path,
              progress: bool = True, rounds: int = 1) -> dict:
    from tqdm import tqdm

    exe = find_tool("llama-bench")
    res = {"status": "running", "started": _dt.datetime.now().isoformat(timespec="seconds"),
           "llama_bench": {"path": str(exe), "version": tool_version(exe)},
           "model": {"path": str(model_path), "random_weights": bool(random_shape), "shape": random_shape},
           "settings": {"types": types, "depths": depths, "p": p, "n": n, "backend": backend,
                        "threads": threads, "repetitions": reps, "rounds": rounds, "repack": repack},
           "commands": [], "rows": [], "round_rows": [], "raw": {}, "errors": {}}
    if random_shape:
        res["warning"] = RANDOM_WEIGHTS_WARNING.format(name=SHAPES[random_shape].note or random_shape)
    stage = staging_dir(out)
    bar = tqdm(total=len(types) * rounds, desc="bench", disable=not progress, dynamic_ncols=True)
    write = lambda: _write_outputs(res, stage, exe, model_path, random_shape, types, backend, threads, reps,  # noqa: E731
                                   rounds)
    with finishing(res, bar, stage, out, write):
        for rnd in range(rounds):
            for t in types:
                if t in res["errors"]:   # failed in an earlier round: its error stands
                    bar.update(1)
                    continue
                tag = f" round {rnd + 1}/{rounds}" if rounds > 1 else ""
                bar.set_description(f"llama-bench {t} (depths {','.join(map(str, depths))}){tag}")
                _bench_one(res, stage, exe, t, rnd, model_path, depths, p, n, backend, threads, reps, repack, rounds,
                           bar)
                (stage / "bench.json").write_text(json.dumps(res, indent=1))
                bar.update(1)
    return res


def _bench_one(res, out, exe, t, rnd, model_path, depths, p, n, backend, threads, reps, repack, rounds, bar):
    cache_type, switches = parse_type_spec(t)
    cmd = bench_cmd(exe, model_path, cache_type, depths, p, n, backend, threads, reps, repack)
    res["commands"].append({"type": t, "round": rnd, "env": switches,
                            "cmd": shlex.join([f"{k}={v}" for k, v in switches.items()] + cmd)})
    r = processes.run_capture(cmd, env=dict(os.environ, **switches))
    log = re.sub(r"[^A-Za-z0-9_.=-]", "_", t)
    (out / (f"llama-bench-{log}.log" if rounds == 1 else f"llama-bench-{log}-r{rnd + 1}.log")).write_text(r.stderr)
    try:
        check_unsupported(r.stdout + r.stderr, cache_type)
        if r.returncode != 0:
            raise ToolError(f"llama-bench failed ({r.returncode}): {tool_reason(r.stderr + r.stdout)}")
        rows = parse_bench_json(r.stdout)
        if switches:   # the variant's rows under its own name
            rows = [dict(row, type=t) for row in rows]
        res["raw"].setdefault(t, []).extend(json.loads(r.stdout[r.stdout.find("["):]))
        res["round_rows"] += [dict(row, round=rnd) for row in rows]
        res["rows"] = summarize(res["round_rows"])
    except (ToolError, ValueError) as e:
        res["errors"][t] = str(e)
        bar.write(f"[{t}] {e}")


def _write_outputs(res, out, exe, model_path, random_shape, types, backend, threads, reps, rounds):
    (out / "bench.json").write_text(json.dumps(res, indent=1))
    md = [f"# turbo-llama bench — {Path(model_path).name}", ""]
    if res["status"] == "interrupted":
        md += ["**interrupted**: the rows below are the runs that finished.", ""]
    if random_shape:
        md += [f"**{res['warning']}**", ""]
    in_rounds = f" in each of {rounds} rounds (median t/s; ratio: median, range of the rounds)" if rounds > 1 else ""
    md += [f"backend {backend}, threads {threads}, -fa 1, {reps} repetitions{in_rounds}; "
           f"{exe.name}: {res['llama_bench']['version']}", "", render_table(res["round_rows"], types), ""]
    noisy = [r for r in res["round_rows"] if r.get("tps_std") and r["tps_std"] > 0.1 * r["tps"]]
    if noisy:
        md += [f"note: {len(noisy)} measurement(s) vary by more than 10% between repetitions "
               "(a busy machine?): " + ", ".join(f"{r['type']} {r['label']}@{r['depth']}"
                                                 + (f" (round {r['round'] + 1})" if rounds > 1 else "")
                                                 for r in noisy), ""]
    if res["errors"]:
        md += ["## Errors", ""] + [f"- **{t}**: {m}" for t, m in res["errors"].items()] + [""]
    (out / "bench.md").write_text("\n".join(md))
    title = Path(model_path).name + ("  (RANDOM WEIGHTS: speed only)" if random_shape else "")
    try:
        from ..eval import plots
    except ImportError as e:   # a machine without matplotlib still gets the numbers
        click.echo(f"note: bench.png not drawn ({e})", err=True)
    else:
        plots.bench_png(res["rows"], out / "bench.png", title=title)


def check_bench_types(type_list: list[str]) -> None:
    """Refuse, before any work, caches the build lacks (asked from a built llama tool that lists them). A build of
    llama-bench alone (llama-bench's --help lists no types) runs unchecked: a type it lacks fails in its own run,
    with llama-bench's reason in bench.md."""
    for name in ("llama-perplexity", "llama-server", "llama-cli", "llama-completion"):
        try:
            exe = find_tool(name)
        except ToolError:
            continue
        check_caches([parse_type_spec(t)[0] for t in dict.fromkeys(type_list)], supported_types(exe))
        return
    try:
        find_tool("llama-bench")
    except ToolError:
        raise ToolError("no built llama tool lists the cache types (llama-perplexity, llama-server, ...), and "
                        "llama-bench is not built: run `turbo-llama build`") from None
    click.echo("note: the cache types are not checked before the runs (llama-bench is built, but no tool that "
               "lists them: llama-perplexity, llama-server, ...); a type this build lacks fails in its own run",
               err=True)
