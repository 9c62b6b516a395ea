"""Needle in a haystack, for a small base model.

A needle sentence with a random number key is put at a depth (fraction) of a haystack (the King
James Bible) cut to a length in tokens; the prompt ends by restarting the needle sentence, so the
base model only has to copy the number. Greedy decoding; score = the exact key is in the
completion. The prompts are built once (tokenisation does not depend on the KV-cache type) and
the very same prompts run for every cache type.
"""
from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

QUICK_LENGTHS = (1024, 2048, 4096)
QUICK_DEPTHS = (0.1, 0.5, 0.9)
FULL_DEPTHS = tuple(round(i / 9, 3) for i in range(10))  # 0.0 ... 1.0, 10 depths

SUBJECT = "the secret passcode of the lighthouse keeper"
INTRO = ("Read the text below. Somewhere in it the secret passcode of the lighthouse keeper is "
         "written down. Remember it.\n\n")
QUESTION = ("\n\nQuestion: What is the secret passcode of the lighthouse keeper?\n"
            "Answer: The secret passcode of the lighthouse keeper is")
N_PREDICT = 8
SEED = 20250405


def needle_sentence(key: str) -> str:
    return f" The secret passcode of the lighthouse keeper is {key}. "


def full_lengths(n_ctx_train: int, start: int = 1024) -> tuple[int, ...]:
    """1K, 2K, 4K, ... up to the model's training context (which itself is included)."""
    out, n = [], start
    while n < n_ctx_train:
        out.append(n)
        n *= 2
    out.append(n_ctx_train)
    return tuple(out)


@dataclass
class Cell:
    length: int          # target prompt length in tokens
    depth: float         # where the needle sits, as a fraction of the haystack
    key: str
    prompt: str
    n_tokens: int = 0    # measured prompt length in tokens
    needle_char: int = 0  # character offset of the needle in the prompt
    needle_depth: float = 0.0  # measured: needle offset / haystack length, in characters

    def to_json(self, with_prompt: bool = False) -> dict:
        d = asdict(self)
        if not with_prompt:
            d.pop("prompt")
        return d


def make_key(rng: random.Random) -> str:
    return str(rng.randint(10000, 99999))


def _boundary(text: str, pos: int) -> int:
    """The first sentence end at or after pos (so the needle does not split a sentence)."""
    if pos <= 0:
        return 0
    if pos >= len(text):
        return len(text)
    m = re.compile(r"[.;:?!]\s").search(text, pos)
    return m.end() - 1 if m else len(text)


def build_cells(haystack: str, lengths: Sequence[int], depths: Sequence[float],
                tokenize: Callable[[str], list], detokenize: Callable[[list], str],
                seed: int = SEED) -> list[Cell]:
    """One prompt per (length, depth): haystack cut so the whole prompt has ~length tokens."""
    rng = random.Random(seed)
    fixed = len(tokenize(INTRO + needle_sentence("00000") + QUESTION))
    max_len = max(lengths)
    # enough characters for the longest haystack (English is ~4 characters a token; be generous)
    hay_tokens = tokenize(haystack[: max_len * 8])
    if len(hay_tokens) < max_len - fixed:
        raise ValueError(f"haystack too short: {len(hay_tokens)} tokens < {max_len - fixed}")
    cells = []
    for length in lengths:
        budget = length - fixed
        if budget < 16:
            raise ValueError(f"NIAH length {length} is too small for the prompt ({fixed} tokens)")
        hay = detokenize(hay_tokens[:budget]).strip()
        ends = [m.end() for m in re.finditer(r"[.;:?!](?=\s|$)", hay)]
        if ends and ends[-1] > len(hay) // 2:
            hay = hay[: ends[-1]]  # end on a whole sentence (a needle at depth 1.0 follows one)
        for depth in depths:
            key = make_key(rng)
            pos = _boundary(hay, int(round(depth * len(hay))))
            prompt = INTRO + hay[:pos].rstrip() + needle_sentence(key) + hay[pos:].lstrip() + QUESTION
            cell = Cell(length=length, depth=float(depth), key=key, prompt=prompt)
            cell.needle_char = len(INTRO) + len(hay[:pos].rstrip())
            cell.needle_depth = pos / max(1, len(hay))
            cell.n_tokens = len(tokenize(prompt))
            cells.append(cell)
    return cells


def run_order(cells: Sequence[Cell]) -> list[int]:
    """Indices of the cells, the needle furthest into the (shared) haystack first.

    Every prompt starts with the same intro + haystack text up to its needle, so with prompt
    caching (llama-server, --swa-full) each cell reuses the previous cell's KV up to its own
    needle and only processes what follows it. Results do not depend on the order.
    """
    return sorted(range(len(cells)), key=lambda i: (-cells[i].needle_char, -cells[i].length))


def found(key: str, completion: str) -> bool:
    """The exact key, not as part of a longer number."""
    return re.search(rf"(?<!\d){re.escape(key)}(?!\d)", completion) is not None


def completion_request(prompt: str, n_predict: int = N_PREDICT) -> dict:
    return {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
            "top_p": 1.0, "min_p": 0.0, "seed": 0, "cache_prompt": True,
            "samplers": ["top_k"], "stream": False}
