"""The eval's progress in units of work, so that the bar's remaining time means something.

A unit is the time to run one prompt token through the model at short context. Each step of the eval
is counted by the tokens it processes, from its own token count, before it runs:
  - a perplexity run: ctx * chunks tokens, each PPL_TOKEN_UNITS (llama-perplexity computes the logits of
    every position, llama-server of the last only: on Gemma 3 270M (262k vocabulary) on CPU a
    perplexity token costs about twice a prompt token; recorded in results/quality-gemma3-270m);
  - a needle cell: the prompt tokens the server processes (those after the longest prefix it shares
    with the previous prompt, which the server's cache keeps), plus DECODE_UNITS for its answer;
  - a server start: START_UNITS.
The counts are estimates of work, not of time; a type whose cache is slower (q4_0 on CPU) runs slower
than its count says, and tqdm's rate (units per second, averaged over the run) absorbs that.
`eta_errors()` replays a recorded run's step timings through the same estimate (tests check it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

PPL_TOKEN_UNITS = 2.0
DECODE_UNITS = 150.0     # N_PREDICT greedy tokens + the HTTP round trip (~0.3 s at ~2 ms per prompt token)
START_UNITS = 300.0      # llama-server: load the model, allocate the cache, warm up


def ppl_units(ctx: int, chunks: int) -> float:
    return PPL_TOKEN_UNITS * ctx * chunks


@dataclass(frozen=True)
class CellGeometry:
    length: int           # prompt tokens
    needle: float         # prompt tokens before the needle


def planned_cells(lengths: Sequence[int], depths: Sequence[float]) -> list[CellGeometry]:
    """The needle cells in run order (niah.run_order: needle furthest in first), before prompts exist."""
    cells = [CellGeometry(L, d * L) for L in lengths for d in depths]
    return sorted(cells, key=lambda c: (-c.needle, -c.length))


def cell_units(cells: Sequence[CellGeometry]) -> list[float]:
    """Work of each cell in run order: the first prompt whole, each next one from its needle on (its text
    before the needle is the previous prompt's, kept in the server's cache), plus the answer."""
    out = []
    for i, c in enumerate(cells):
        processed = c.length if i == 0 else c.length - c.needle
        out.append(max(processed, 1.0) + DECODE_UNITS)
    return out


def eta_errors(steps: Sequence[tuple[float, float]], after: float = 0.1) -> list[float]:
    """Replay (units, seconds) steps in order as tqdm shows them: after each step done once `after` of the
    run's time has passed, the shown remaining time is (left units) / (done units / elapsed). Returns the
    ratio shown / true remaining time at each of those points (1.0 = exact)."""
    total_units = sum(u for u, _ in steps)
    total_s = sum(s for _, s in steps)
    done_u = done_s = 0.0
    ratios = []
    for u, s in steps[:-1]:
        done_u += u
        done_s += s
        if done_s < after * total_s:
            continue
        shown = (total_units - done_u) / (done_u / done_s)
        ratios.append(shown / (total_s - done_s))
    return ratios


class WorkBar:
    """A tqdm bar counted in units of work; its rate is the whole run's average (smoothing=0), which is
    what eta_errors() replays."""

    def __init__(self, total: float, desc: str = "eval", enabled: bool = True):
        from tqdm import tqdm
        self._bar = tqdm(total=round(total), desc=desc, unit="u", disable=not enabled, dynamic_ncols=True,
                         smoothing=0, bar_format="{l_bar}{bar}| {percentage:3.0f}% [{elapsed}<{remaining}]")
        self._done = 0.0

    def describe(self, text: str) -> None:
        self._bar.set_description(text)

    def add(self, units: float) -> None:
        self._done += units
        self._bar.update(round(self._done) - self._bar.n)

    def write(self, msg: str) -> None:
        self._bar.write(msg)

    def close(self) -> None:
        self._bar.close()
