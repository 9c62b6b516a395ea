"""The eval's report: results.json, results.md (one table row per cache type or K/V pair) and the plots."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..cache_types import bits_per_value
from . import niah as _niah
from . import plots
from .llama_tools import finite


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".json.partial")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


def _fmt(x, spec: str, none: str = "–") -> str:
    return format(x, spec) if finite(x) else none


def worst_by_text(res: dict) -> dict[str, dict]:
    """{cache: {"ppl_ratio", "kld_mean", "ppl_text", "kld_text"}}: each cache's worst PPL ratio to f16 and worst
    mean KLD over the texts it was measured on (the text each came from); caches without a figure are left out."""
    out: dict[str, dict] = {}
    for text, ppl in (res.get("ppl_by_text") or {}).items():
        base = (ppl.get("f16") or {}).get("ppl")
        for t, r in ppl.items():
            if t == "f16" or not (finite(r.get("ppl")) and finite(base)):
                continue
            w = out.setdefault(t, {"ppl_ratio": None, "kld_mean": None, "ppl_text": None, "kld_text": None})
            ratio = r["ppl"] / base
            if w["ppl_ratio"] is None or ratio > w["ppl_ratio"]:
                w["ppl_ratio"], w["ppl_text"] = ratio, text
            kld = r.get("kld_mean")
            if finite(kld) and (w["kld_mean"] is None or kld > w["kld_mean"]):
                w["kld_mean"], w["kld_text"] = kld, text
    return out


def per_text_table(res: dict) -> list[str]:
    """With more than one text: PPL / f16 and mean KLD of each cache on each text, and the worst of them."""
    by_text = res.get("ppl_by_text") or {}
    if len(by_text) < 2:
        return []
    names = list(by_text)
    worst = worst_by_text(res)
    lines = ["", "## Each text, and the worst", "",
             f"PPL / f16 and mean KLD on each text ({', '.join(names)}; the table above is {names[0]}'s); "
             "**worst**: the highest of the texts.", "",
             "| type | " + " | ".join(f"{n}: PPL / f16 | {n}: KLD" for n in names) + " | **worst PPL / f16** | **worst KLD** |",
             "|---|" + "---|---|" * len(names) + "---|---|"]
    for t in res.get("types", []):
        if t == "f16":
            continue
        cells = []
        for n in names:
            r, base = by_text[n].get(t) or {}, (by_text[n].get("f16") or {}).get("ppl")
            ratio = r["ppl"] / base if finite(r.get("ppl")) and finite(base) else None
            cells += [_fmt(ratio, ".4f"), _fmt(r.get("kld_mean"), ".6f")]
        w = worst.get(t) or {}
        cells += [f"{_fmt(w.get('ppl_ratio'), '.4f')} ({w.get('ppl_text') or '–'})",
                  f"{_fmt(w.get('kld_mean'), '.6f')} ({w.get('kld_text') or '–'})"]
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return lines


def render_markdown(res: dict) -> str:
    s = res.get("settings", {})
    lines = [f"# turbo-llama eval — {Path(res.get('model', {}).get('path', '?')).name}", "",
             f"status: **{res.get('status')}** · backend {s.get('backend')} · ctx {s.get('ctx')} · "
             f"{s.get('chunks')} chunks of {Path(str(s.get('text'))).name} · threads {s.get('threads')}"
             f" · started {res.get('started')}", ""]
    if res.get("status") == "interrupted":
        lines += ["**interrupted**: the rows below hold the steps that finished; a dash marks what did not run.", ""]
    base = (res.get("ppl") or {}).get("f16", {}).get("ppl")
    lines += ["| type | bits/value | KV MiB | KV bytes/token/layer | PPL ± err | PPL / f16 | mean KLD | "
              "KLD p99 | same top % | NIAH |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for t in res.get("types", []):
        r = (res.get("ppl") or {}).get(t, {})
        kv = r.get("kv") or {}
        nres = (res.get("niah_results") or {}).get(t) or {}
        niah = f"{sum(nres.values())}/{len(nres)}" if nres else "–"
        err = (res.get("errors") or {}).get(t)
        ppl = f"{r['ppl']:.4f} ± {r['ppl_err']:.4f}" if finite(r.get("ppl")) else ("error" if err else "–")
        ratio = r["ppl"] / base if finite(r.get("ppl")) and finite(base) else None
        if t == "f16":
            kld, p99, same = "0 (base)", "–", "100 (base)"
        else:
            kld = _fmt(r.get("kld_mean"), ".6f")
            p99 = _fmt(r.get("kld_p99"), ".5f")
            same = _fmt(r.get("same_top"), ".2f")
        bits = r.get("bits_per_value") or bits_per_value(t)
        lines.append(f"| {t} | {_fmt(round(bits, 4) if finite(bits) else None, 'g', '?')} | {_fmt(kv.get('kv_mib'), '.2f')} | "
                     f"{_fmt(kv.get('bytes_per_token_per_layer'), '.0f')} | {ppl} | {_fmt(ratio, '.4f')} | "
                     f"{kld} | {p99} | {same} | {niah} |")
    lines += per_text_table(res)
    f16n = (res.get("niah_results") or {}).get("f16") or {}
    if f16n and sum(f16n.values()) < 0.8 * len(f16n):
        lines += ["", f"**warning: the f16 baseline found only {sum(f16n.values())}/{len(f16n)} needles: "
                  "the NIAH task is too hard for this model, its scores say little about the cache types**"]
    errs = res.get("errors") or {}
    if errs:
        lines += ["", "## Errors", ""] + [f"- **{t}**: {m}" for t, m in errs.items()]
    n = res.get("niah") or {}
    if n.get("cells"):
        lines += ["", f"NIAH: lengths {n.get('lengths')} × depths {n.get('depths')}; needle "
                  f"\"{_niah.needle_sentence('<key>').strip()}\", greedy, {_niah.N_PREDICT} tokens; "
                  "score = exact key in the completion. Same prompts for every type."]
    lines += ["", "KV MiB: llama's own `llama_kv_cache: size` lines (iSWA: SWA + non-SWA caches summed) "
              "of the perplexity run at this context; bits/value: 16 x that size / f16's (above the type's own "
              "bits where some layers store another type, e.g. q8_0 keys in sliding-window layers).", ""]
    k_paths = [(t, ((res.get("ppl") or {}).get(t, {}).get("kv") or {}).get("turbo_k")) for t in res.get("types", [])]
    k_paths = [(t, msgs) for t, msgs in k_paths if msgs]
    if k_paths:
        lines += ["How turbo K was stored (llama's log, `turbo K:` lines):", ""]
        lines += [f"- {t}: " + "; ".join(msgs) for t, msgs in k_paths] + [""]
    if res.get("timings"):
        lines += ["Timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in res["timings"].items()), ""]
    return "\n".join(lines)


def finish_outputs(res: dict, out: Path) -> None:
    """results.json, results.md and the plots of what exists (also for a failed or interrupted run)."""
    if len(res.get("ppl_by_text") or {}) > 1:
        res["worst_of_texts"] = worst_by_text(res)
    write_json(out / "results.json", res)
    (out / "results.md").write_text(render_markdown(res))
    try:
        plots.niah_png(res, out / "niah.png")
        plots.kld_png(res, out / "kld.png")
    except Exception as e:  # noqa: BLE001 - a plot must never lose the numbers
        print(f"warning: plotting failed: {e}", file=sys.stderr)


