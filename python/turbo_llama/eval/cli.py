"""The `turbo-llama eval` command: options, checks before any work, then run.run_eval."""
from __future__ import annotations

import datetime as _dt
import os
import sys
from pathlib import Path

import click

from ..cache_types import CacheTypeError, default_ladder, supported_types
from ..errors import ToolError
from . import model as _model
from . import niah as _niah
from . import processes
from . import texts as _texts
from .run import FULL_CHUNKS, QUICK_CHUNKS, QUICK_CTX, check_inputs, run_eval


def _csv(s: str, conv=str) -> list:
    return [conv(x.strip()) for x in s.split(",") if x.strip()]


@click.command("eval")
@click.option("--model", "model_spec", default=None, metavar="NAME|PATH",
              help=f"{' or '.join(_model.MODEL_NAMES)} (fetched and checked once), or a GGUF file "
                   f"[default: {_model.DEFAULT_MODEL}]")
@click.option("--types", default=None, metavar="LIST",
              help="caches, comma separated: TYPE or K/V (e.g. f16,q8_0,turbo3,q8_0/turbo3); f16 always runs "
                   "first (the KLD base) [default: the quality ladder, as far as the build supports it]")
@click.option("--full", is_flag=True, help=f"the full eval: {FULL_CHUNKS} chunks, needles from 1K tokens to the "
                                           "model's training context at 10 depths")
@click.option("--quick", is_flag=True, help="the quick eval (the default; kept for scripts)")
@click.option("--ctx", type=int, default=None, help=f"perplexity context [{QUICK_CTX}]")
@click.option("--chunks", type=int, default=None, help=f"perplexity chunks [quick {QUICK_CHUNKS}, full {FULL_CHUNKS}]")
@click.option("--text", default=None, metavar="LIST",
              help="perplexity texts, comma separated: jargon, kjv, code (shipped with turbo-llama: the Jargon "
                   "File, the King James Bible, Python's standard library), `all`, or text files; each is "
                   "reported and the report gives the worst [quick: jargon; full: all]")
@click.option("--haystack", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="NIAH haystack text [the King James Bible, shipped with turbo-llama]")
@click.option("--niah-lengths", default=None, help="comma separated token lengths "
              f"[quick: {','.join(map(str, _niah.QUICK_LENGTHS))}; full: 1K..model context]")
@click.option("--niah-depths", default=None, help="comma separated fractions [quick: 0.1,0.5,0.9; full: 10]")
@click.option("--no-niah", "skip_niah", is_flag=True, help="perplexity and KLD only (no needles)")
@click.option("--backend", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--threads", type=int, default=os.cpu_count() or 1, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="output directory [results/eval-YYYYmmdd-HHMMSS]")
@click.option("--repack/--no-repack", default=None,
              help="CPU weight repacking (default off on cpu: its AMX kernels SIGILL on some VMs)")
@click.option("--skip-ppl", is_flag=True, hidden=True)
def eval_command(model_spec, types, full, quick, ctx, chunks, text, haystack, niah_lengths, niah_depths, skip_niah,
                 backend, threads, out, repack, skip_ppl):
    """Perplexity, KL divergence and needle-in-a-haystack for each KV cache (quick by default; --full)."""
    if full and quick:
        raise click.UsageError("--full and --quick exclude each other")
    try:
        with processes.interruptible():
            _eval_cli(model_spec, types, full, ctx, chunks, text, haystack, niah_lengths, niah_depths, skip_niah,
                      backend, threads, out, repack, skip_ppl)
    except KeyboardInterrupt as e:
        sys.exit(processes.exit_code(e))


def resolve_texts(spec: str) -> list[tuple[str, Path]]:
    """`--text`'s list as (name, file) pairs: a shipped text's name (or `all`), or a file (named by its stem)."""
    names = list(_texts.TEXT_NAMES) if spec.strip() == "all" else _csv(spec)
    if not names:
        raise ValueError("--text: no text given")
    out: list[tuple[str, Path]] = []
    for n in names:
        if n in _texts.TEXT_NAMES:
            pair = (n, _model.shipped_text(n))
        else:
            p = Path(n).expanduser()
            if not p.is_file():
                raise ValueError(f"--text {n}: no such file, and not a shipped text "
                                 f"({', '.join(_texts.TEXT_NAMES)}, all)")
            pair = (p.stem, p)
        if pair[0] in dict(out):
            raise ValueError(f"--text: {pair[0]} is given twice")
        out.append(pair)
    return out


def _eval_cli(model_spec, types, full, ctx, chunks, text, haystack, niah_lengths, niah_depths, skip_niah,
              backend, threads, out, repack, skip_ppl):
    try:
        if types is None:
            tools, _ = check_inputs([], need_ppl=not skip_ppl, need_niah=not skip_niah)
            type_list, skipped = default_ladder(supported_types(next(iter(tools.values()))))
            if skipped:
                click.echo(f"note: this build lacks {', '.join(skipped)}: not in the ladder", err=True)
        else:
            type_list = _csv(types)
        check_inputs(type_list, need_ppl=not skip_ppl, need_niah=not skip_niah)   # before any work
        mpath = _model.resolve_model(model_spec)
        ctx = ctx or QUICK_CTX
        chunks = chunks or (FULL_CHUNKS if full else QUICK_CHUNKS)
        if niah_lengths:
            lengths = _csv(niah_lengths, int)
        else:
            lengths = list(_niah.full_lengths(_model.n_ctx_train(mpath)) if full else _niah.QUICK_LENGTHS)
        depths = _csv(niah_depths, float) if niah_depths else list(_niah.FULL_DEPTHS if full else _niah.QUICK_DEPTHS)
        text = None if skip_ppl else resolve_texts(text or ("all" if full else "jargon"))
    except (ValueError, CacheTypeError, ToolError, _model.AssetError) as e:
        raise click.ClickException(str(e))
    out = out or Path("results") / f"eval-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    if repack is None:
        repack = backend != "cpu"
    click.echo(f"turbo-llama eval → {out}  ({'full' if full else 'quick'}: {','.join(type_list)}; ctx {ctx}, "
               f"{chunks} chunk(s) of {','.join(n for n, _ in text) if text else 'no text'}, "
               + ("no NIAH" if skip_niah else f"NIAH {len(lengths)}×{len(depths)}")
               + f"; {mpath.name}, {backend}, {threads} threads)",
               err=True)
    try:
        res = run_eval(model_path=mpath, types=type_list, ctx=ctx, chunks=chunks, text=text, haystack=haystack,
                       niah_lengths=lengths, niah_depths=depths, backend=backend, threads=threads, out=out,
                       quick=not full, repack=repack, skip_ppl=skip_ppl, skip_niah=skip_niah)
    except KeyboardInterrupt as e:
        click.echo(f"\ninterrupted ({e}): the finished part is in {out}/results.md", err=True)
        raise
    except (_model.AssetError, ToolError, CacheTypeError) as e:
        raise click.ClickException(f"{e} (no results written)")
    click.echo((out / "results.md").read_text())
    if res.get("errors"):
        raise click.ClickException("some caches failed: " + "; ".join(f"{t}: {m}" for t, m in res["errors"].items()))
