"""`turbo-llama bench serve`: llama-server under N concurrent users, per KV-cache type (#50).

For each cache type and number of users N, one `llama-server -np N -c N*CTX -fa on -ctk T -ctv T` on a free
127.0.0.1 port; N client threads (stdlib http.client) each send their requests one after another, streamed
(SSE), each request a distinct prompt of --prompt-tokens tokens and --n-predict generated tokens (ignore_eos, so
every request generates exactly that many). Bounded: --requests per user and --time-limit seconds per run (no new
request starts after it). Two modes, in one command or either alone:

  --users 1,2,4       equal slots for every type
  --budget-gib X      a fixed cache budget: each type gets as many slots of CTX tokens as fit in X GiB

Slots for a budget: the bytes one slot of CTX cells costs come from llama's own `llama_kv_cache: size = ... MiB`
log lines (summed over the caches of an iSWA model) of a start of that type with one slot (-np 1 -c CTX), a
run of --users 1 when there is one, else a probe start. Not from bits per value and the model's shape: the
turbo glue stores some layers' keys in another type (Gemma 3's window layers keep q8_0 keys), a sliding-window
cache holds min(CTX, window + ubatch) cells per slot, not CTX, and both differ between models; the log line is
what llama allocated. Per slot streams (the default, --no-kv-unified) cost exactly N times one slot; a unified
cache (--kv-unified) costs at most that (its window cache is shared). The actual size of every run is recorded,
from its own log, next to the budget.

Measured per run: aggregate generated tokens/s (all tokens generated / the load phase's wall time), time to first
token (median, p90: from sending the request to the first streamed token), per-user decode tokens/s (per request:
tokens after the first / the time between the first and the last token; median and min), and the server's own
`timings` (prompt and decode tokens/s per request, medians).

Correctness under load, every run: every answer has text (not empty), is valid text (no U+FFFD replacement
character, no NaN in its timings) and has exactly --n-predict tokens; and no answer carries another client's key.
Each prompt is a distinct passage of the King James Bible followed by a line that states a key of its own three
times ("Code: Heron-4821. Code: Heron-4821. Code: Heron-4821. Code:"), which the model repeats; an answer that
holds another request's key read another slot's cache (leakage), and such a key cannot come by chance. Before
the timed phase (--check, the default) the first wave's prompts also run alone, one at a time, on the same
server: the report counts the loaded answers that repeat their own key and those identical to their solo answer,
but neither fails the run, because greedy answers under load are not batch-invariant in llama.cpp, for every cache
type (results/reliability.md: upstream's arithmetic depends on how requests are batched; the first departure
comes after 8-15 tokens on average): exact equality with the solo answer is not a reliable test of isolation, a
foreign key is.

Outputs (in --out): serve.json (settings, commands, every run and request), serve.md (the tables), serve.png
(aggregate tokens/s against concurrent users, one line per type; the budget runs as stars), server-*.log (each
server's log, named in any error). Written into <out>.partial and renamed at the end, like `turbo-llama bench`.
"""
from __future__ import annotations

import datetime as _dt
import http.client
import json
import math
import os
import platform
import shlex
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..build.installed import find_tool
from ..cache_types import parse_cache
from ..errors import ToolError
from ..eval.llama_tools import LlamaServer, UnsupportedCacheType, check_unsupported, parse_kv_cache, tool_version
from ..eval.outputs import finishing, staging_dir
from ..util import tail

GIB = 2 ** 30
MIB = 2 ** 20
KEY_WORDS = ("Heron", "Falcon", "Otter", "Maple", "Cobalt", "Juniper", "Quartz", "Walrus", "Saffron", "Ember",
             "Lynx", "Marble", "Tundra", "Willow", "Basalt", "Comet")
LOG_TAIL = 25


class ServeError(ToolError):
    """A server that cannot be started or that fails under load; the message names its log."""


# --------------------------------------------------------------------------------------------------- pure parts
def parse_int_list(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, unique, each >= 1); ValueError otherwise."""
    try:
        vals = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"expected comma separated integers: {text!r}") from None
    if not vals or vals[0] < 1:
        raise ValueError(f"expected integers >= 1: {text!r}")
    return vals


def slots_for_budget(budget_bytes: float, per_slot_bytes: float, max_slots: int | None = None) -> int:
    """How many slots of per_slot_bytes fit in budget_bytes (0 when not even one does), capped at max_slots."""
    if per_slot_bytes <= 0 or not math.isfinite(per_slot_bytes):
        raise ValueError(f"bytes per slot must be positive: {per_slot_bytes}")
    n = int(math.floor(budget_bytes / per_slot_bytes * (1 + 1e-12)))   # exact fits are not lost to rounding
    return min(n, max_slots) if max_slots else n


def kv_bytes(log_text: str) -> float | None:
    """The KV cache llama allocated (bytes), from a log's `llama_kv_cache: size = ... MiB` lines (iSWA: their sum)."""
    kv = parse_kv_cache(log_text)
    return kv["kv_mib"] * MIB if kv else None


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between the order statistics (numpy's default); None for no values."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def iter_sse(lines: Iterable[bytes | str]) -> Iterator[tuple[str, dict | str]]:
    """Server-sent events from the lines of a streamed response: ("data", payload) per event, ("error", payload) for
    llama-server's `error: {...}` lines; payloads are parsed JSON where they are JSON, else the raw text. Several
    `data:` lines of one event are joined with newlines (the SSE rule); an OpenAI-style `data: [DONE]` ends it."""
    buf: list[str] = []
    kind = "data"

    def flush():
        text = "\n".join(buf)
        buf.clear()
        try:
            return json.loads(text)
        except ValueError:
            return text

    for raw in lines:
        line = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
        line = line.rstrip("\r\n")
        if not line:
            if buf:
                yield kind, flush()
            kind = "data"
            continue
        if line.startswith(":"):   # an SSE comment (keep-alive)
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            if value.strip() == "[DONE]":
                break
            buf.append(value)
        elif name == "error":
            if buf:
                yield kind, flush()
            buf.append(value)
            kind = "error"
    if buf:
        yield kind, flush()


def request_key(i: int) -> str:
    """The key of request i: a word and a number, distinct for every i."""
    return f"{KEY_WORDS[i % len(KEY_WORDS)]}-{1000 + 7919 * i % 9000}"   # 7919 is prime to 9000: i < 9000 distinct


def key_line(key: str) -> str:
    return f"\nCode: {key}. Code: {key}. Code: {key}. Code:"


def check_answer(rec: dict, n_predict: int, own_key: str | None, other_keys: Iterable[str]) -> list[str]:
    """The problems of one answer under load (empty list: none): an error, no text, invalid text, a token count
    other than n_predict, non-finite timings, another request's key in it (leakage)."""
    if rec.get("error"):
        return [f"error: {rec['error']}"]
    bad = []
    text = rec.get("content") or ""
    if not text.strip():
        bad.append("empty answer")
    if "\ufffd" in text:
        bad.append("invalid UTF-8 (U+FFFD in the text)")
    if rec.get("n_tokens") != n_predict:
        bad.append(f"{rec.get('n_tokens')} tokens generated, not {n_predict}")
    t = rec.get("timings") or {}
    if any(isinstance(v, float) and not math.isfinite(v) for v in t.values()):
        bad.append("non-finite server timings")
    leaked = sorted(k for k in other_keys if k != own_key and _has_key(text, k))
    if leaked:
        bad.append(f"another request's key in the answer ({', '.join(leaked)}): cross-slot leakage")
    return bad


def _has_key(text: str, key: str) -> bool:
    """key in text as a whole token (Heron-482 is not in Heron-4821)."""
    i = text.find(key)
    while i >= 0:
        j = i + len(key)
        if (i == 0 or not text[i - 1].isalnum()) and (j >= len(text) or not text[j].isdigit()):
            return True
        i = text.find(key, i + 1)
    return False


def summarize_run(recs: list[dict], wall_s: float) -> dict:
    """The figures of one run from its request records (see stream_completion) and the load phase's wall time."""
    done = [r for r in recs if not r.get("error") and r.get("n_tokens")]
    gen = sum(r["n_tokens"] for r in done)
    ttft = [1000 * (r["t_first"] - r["t_send"]) for r in done if r.get("t_first") is not None]
    decode = [r["decode_tps"] for r in done if r.get("decode_tps")]
    srv_dec = [r["timings"]["predicted_per_second"] for r in done
               if (r.get("timings") or {}).get("predicted_per_second")]
    srv_pp = [r["timings"]["prompt_per_second"] for r in done if (r.get("timings") or {}).get("prompt_per_second")]
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    return {"requests": len(recs), "completed": len(done), "failed": len(recs) - len(done),
            "generated_tokens": gen, "prompt_tokens": sum(r.get("n_prompt") or 0 for r in done),
            "wall_s": wall_s, "agg_tps": gen / wall_s if wall_s > 0 else None,
            "ttft_ms_median": med(ttft), "ttft_ms_p90": percentile(ttft, 90),
            "user_tps_median": med(decode), "user_tps_min": min(decode) if decode else None,
            "server_decode_tps_median": med(srv_dec), "server_prompt_tps_median": med(srv_pp)}


# --------------------------------------------------------------------------------------------------- the client
def stream_completion(port: int, payload: dict, timeout: float) -> dict:
    """POST /completion with stream: the answer, its tokens and the client-side times (perf_counter seconds):
    t_send, t_first (first token), t_last (last token), t_end; decode_tps over the tokens after the first."""
    rec: dict = {"t_send": time.perf_counter(), "t_first": None, "t_last": None, "content": "", "n_tokens": 0,
                 "error": None}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    parts, n_stream, n_at_first = [], 0, 0
    try:
        conn.request("POST", "/completion", body=json.dumps(dict(payload, stream=True)),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            rec["error"] = f"HTTP {resp.status}: {resp.read(2000).decode(errors='replace').strip()}"
            return rec
        for kind, ev in iter_sse(resp):
            now = time.perf_counter()
            if kind == "error" or not isinstance(ev, dict):
                rec["error"] = f"server error: {ev}"
                break
            if "error" in ev and "content" not in ev:
                rec["error"] = f"server error: {ev['error']}"
                break
            n_new = len(ev.get("tokens") or []) or (1 if ev.get("content") and not ev.get("stop") else 0)
            if n_new:
                if rec["t_first"] is None:
                    rec["t_first"], n_at_first = now, n_new
                rec["t_last"] = now
                n_stream += n_new
            parts.append(ev.get("content") or "")
            if ev.get("stop"):
                rec["timings"] = ev.get("timings") or {}
                rec["n_prompt"] = ev.get("tokens_evaluated")
                rec["id_slot"] = ev.get("id_slot")
                rec["stop_type"] = ev.get("stop_type")
                rec["n_tokens"] = ev.get("tokens_predicted", n_stream)
                break
        else:
            if rec["error"] is None:
                rec["error"] = "the stream ended without a final event"
    except (OSError, http.client.HTTPException) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
        rec["t_end"] = time.perf_counter()
        rec["content"] = "".join(parts)
        rec["n_stream"] = n_stream
    if rec["t_first"] is not None and rec["t_last"] > rec["t_first"] and n_stream > n_at_first:
        rec["decode_tps"] = (n_stream - n_at_first) / (rec["t_last"] - rec["t_first"])
    return rec


def completion_payload(prompt: list[int], n_predict: int) -> dict:
    return {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "ignore_eos": True,
            "cache_prompt": False, "return_tokens": True}


def drive_clients(port: int, prompts: list[list[int]], users: int, requests_per_user: int, n_predict: int,
                  time_limit: float, request_timeout: float) -> tuple[list[dict], float]:
    """N client threads, started together; client u sends prompts u, u+N, u+2N, ... one after another, until it sent
    requests_per_user or time_limit seconds passed (no request starts after it). Returns the records (sorted by
    prompt) and the wall time from the start to the end of the last request."""
    recs: list[dict] = []
    lock = threading.Lock()
    start = threading.Barrier(users + 1)
    t0 = [0.0]

    def client(u):
        start.wait()
        for r in range(requests_per_user):
            idx = u + r * users
            if idx >= len(prompts) or time.perf_counter() - t0[0] > time_limit:
                break
            rec = stream_completion(port, completion_payload(prompts[idx], n_predict), request_timeout)
            rec.update(user=u, prompt=idx)
            with lock:
                recs.append(rec)

    threads = [threading.Thread(target=client, args=(u,), daemon=True) for u in range(users)]
    for t in threads:
        t.start()
    t0[0] = time.perf_counter()
    start.wait()
    for t in threads:
        # bounded: a request ends by itself (n_predict), or by its socket timeout
        t.join()
    end = max((r["t_end"] for r in recs), default=time.perf_counter())
    return sorted(recs, key=lambda r: r["prompt"]), end - t0[0]


# --------------------------------------------------------------------------------------------------- prompts
def build_prompts(text: str, n: int, prompt_tokens: int, tokenize: Callable[[str, bool], list[int]]) -> list[dict]:
    """n prompts of exactly prompt_tokens tokens: a passage of text (BOS first, where the model has one) and the key
    line of the request. Prompt i is the same for every n (the passages follow each other through the text, from
    the start again at its end; the key makes each distinct). tokenize(text, add_special) is the server's."""
    out = []
    span = 8 * prompt_tokens + 64   # characters: more than prompt_tokens tokens of prose
    room = max(1, len(text) - span)
    for i in range(n):
        key = request_key(i)
        tail_toks = tokenize(key_line(key), False)
        n_fill = prompt_tokens - len(tail_toks)
        if n_fill < 1 + 4:
            raise ValueError(f"--prompt-tokens {prompt_tokens} is too short for the key line "
                             f"({len(tail_toks)} tokens): give at least {len(tail_toks) + 5}")
        start = (i * span) % room
        start = text.find(" ", start) + 1 if text.find(" ", start) >= 0 else start   # at a word
        chunk = text[start: start + span]
        fill = tokenize(chunk, True)[:n_fill]
        if len(fill) < n_fill:
            raise ValueError(f"the prompt text is too short for {prompt_tokens}-token prompts")
        out.append({"key": key, "tokens": fill + tail_toks, "text_offset": start})
    return out


# --------------------------------------------------------------------------------------------------- one server
@dataclass
class ServeSettings:
    model: Path
    ctx: int
    prompt_tokens: int
    n_predict: int
    requests: int
    time_limit: float
    kv_unified: bool
    backend: str
    threads: int
    repack: bool
    check: bool
    request_timeout: float = 600.0
    start_timeout: float = 300.0
    port: int | None = None
    extra: list[str] = field(default_factory=list)

    def server_args(self, cache: str, slots: int) -> list[str]:
        args = ["-np", str(slots), "-c", str(slots * self.ctx), "-fa", "on", *parse_cache(cache).args(),
                "-kvu" if self.kv_unified else "-no-kvu", "-t", str(self.threads),
                "-ngl", "99" if self.backend == "cuda" else "0", "--cache-ram", "0", "-lv", "4", "--no-webui",
                "--no-warmup", "--threads-http", str(slots + 4)]
        if not self.repack:
            args.append("--no-repack")
        return args + list(self.extra)


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def start_server(exe: Path, s: ServeSettings, cache: str, slots: int, log: Path) -> LlamaServer:
    """A started, healthy llama-server of ours (its /props names our model), or ServeError with the log's tail."""
    if s.port and port_in_use(s.port):
        raise ServeError(f"port {s.port} on 127.0.0.1 is busy (another server?): pass another --port, or none")
    for attempt in range(3):
        srv = LlamaServer(exe, s.model, s.server_args(cache, slots), log_path=log, startup_timeout=s.start_timeout,
                          port=s.port or 0)
        try:
            srv.start()
            break
        except ToolError as e:
            text = srv.log_text()
            if not s.port and "couldn't bind" in text and attempt < 2:   # the free port was taken meanwhile
                continue
            _start_failed(srv, cache, slots, log, text, e)
    try:
        props = json.loads(_get(srv.port, "/props"))
        if Path(props.get("model_path", s.model)).resolve() != Path(s.model).resolve():
            raise ServeError(f"port {srv.port} answers for another model ({props.get('model_path')}): "
                             "another server holds the port")
        if props.get("total_slots", slots) != slots:
            raise ServeError(f"llama-server ({cache}) has {props['total_slots']} slots, not the {slots} asked for "
                             f"(-np {slots}); its log: {log}")
    except (OSError, ValueError, http.client.HTTPException) as e:
        srv.stop()
        raise ServeError(f"llama-server ({cache}) is healthy but /props fails ({e}); its log: {log}") from None
    except BaseException:
        srv.stop()
        raise
    return srv


def _start_failed(srv: LlamaServer, cache: str, slots: int, log: Path, text: str, e: ToolError):
    try:
        check_unsupported(text, parse_cache(cache).k)
    except UnsupportedCacheType as u:
        raise ServeError(f"{u}; its log: {log}") from None
    raise ServeError(f"llama-server ({cache}, -np {slots}) failed to start: {e}\n"
                     f"command: {shlex.join(srv.cmd)}\nits log, {log}, ends:\n{tail(log, LOG_TAIL)}") from None


def _get(port: int, path: str, timeout: float = 30) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode(errors="replace")
    finally:
        conn.close()


def tokenizer_of(srv: LlamaServer) -> Callable[[str, bool], list[int]]:
    def tok(text: str, add_special: bool) -> list[int]:
        return srv.post("/tokenize", {"content": text, "add_special": add_special})["tokens"]
    return tok


def probe_slot_bytes(exe: Path, s: ServeSettings, cache: str, log: Path) -> float:
    """Bytes of one slot of s.ctx cells of this cache: llama's log line of a start with -np 1."""
    srv = start_server(exe, s, cache, 1, log)
    try:
        b = kv_bytes(srv.log_text())
    finally:
        srv.stop()
    if not b:
        raise ServeError(f"no `llama_kv_cache: size` line in the probe's log ({log}): cannot size the slots")
    return b


def run_one(exe: Path, s: ServeSettings, cache: str, users: int, prompts_for: Callable[[LlamaServer, int], list[dict]],
            log: Path, note: Callable[[str], None]) -> dict:
    """One server of `users` slots: the solo answers of the first wave (s.check), then the timed load phase."""
    run: dict = {"type": cache, "users": users, "log": log.name}
    srv = start_server(exe, s, cache, users, log)
    try:
        run["cmd"] = shlex.join(srv.cmd)
        run["kv_bytes"] = kv_bytes(srv.log_text())
        n_req = users * s.requests
        prompts = prompts_for(srv, n_req)
        toks = [p["tokens"] for p in prompts]
        first = min(users, n_req)
        solo: dict[int, dict] = {}
        if s.check:
            note(f"{cache} x{users}: {first} solo answer(s)")
            for i in range(first):
                solo[i] = stream_completion(srv.port, completion_payload(toks[i], s.n_predict), s.request_timeout)
        else:   # one short request, so the timed phase does not pay for the first graph
            stream_completion(srv.port, completion_payload(toks[0], 2), s.request_timeout)
        note(f"{cache} x{users}: {n_req} requests from {users} users")
        recs, wall = drive_clients(srv.port, toks, users, s.requests, s.n_predict, s.time_limit, s.request_timeout)
        if any(r.get("error") for r in recs) and srv.proc is not None and srv.proc.poll() is not None:
            raise ServeError(f"llama-server ({cache}, -np {users}) died under load (exit {srv.proc.returncode}); "
                             f"its log, {log}, ends:\n{tail(log, LOG_TAIL)}")
    finally:
        srv.stop()
    keys = [p["key"] for p in prompts]
    problems, own_key, same, solo_key = {}, 0, 0, 0
    for r in recs:
        i = r["prompt"]
        bad = check_answer(r, s.n_predict, keys[i], keys)
        if bad:
            problems[i] = bad
        r["has_own_key"] = _has_key(r.get("content") or "", keys[i])
        own_key += r["has_own_key"]
        if i in solo:
            ref = solo[i]
            sb = check_answer(ref, s.n_predict, keys[i], keys)
            if sb:
                problems.setdefault(i, []).extend(f"solo: {b}" for b in sb)
            r["solo_content"] = ref.get("content")
            r["same_as_solo"] = ref.get("content") == r.get("content") and not ref.get("error")
            same += r["same_as_solo"]
            solo_key += _has_key(ref.get("content") or "", keys[i])
    run.update(summarize_run(recs, wall))
    run["check"] = {"answers": len(recs), "ok": len(recs) - len(problems),   # problems: by the prompt of a record
                    "problems": {str(k): v for k, v in problems.items()}, "own_key": own_key,
                    "solo_compared": len([r for r in recs if "same_as_solo" in r]), "same_as_solo": same,
                    "solo_own_key": solo_key, "solo_runs": len(solo),
                    # the server's slots that answered: all N of them when the N users really ran side by side
                    "slots_used": len({r.get("id_slot") for r in recs if r.get("id_slot") is not None})}
    run["requests_detail"] = [{k: r.get(k) for k in ("user", "prompt", "id_slot", "n_prompt", "n_tokens", "error",
                                                      "decode_tps", "content", "has_own_key", "same_as_solo",
                                                      "solo_content", "timings")}
                              | {"key": keys[r["prompt"]],
                                 "ttft_ms": 1000 * (r["t_first"] - r["t_send"]) if r.get("t_first") else None,
                                 "seconds": r["t_end"] - r["t_send"]} for r in recs]
    return run


def run_line(run: dict) -> str:
    """The progress line of one finished run."""
    f = lambda v, fmt: "–" if v is None else format(v, fmt)  # noqa: E731
    c = run["check"]
    same = f", {c['same_as_solo']}/{c['solo_compared']} as solo" if c["solo_compared"] else ""
    mode = f" (budget {run['budget_gib']:g} GiB)" if run.get("budget_gib") else ""
    return (f"{run['type']} x{run['users']}{mode}: {f(run['agg_tps'], '.2f')} tok/s aggregate, TTFT "
            f"{f(run['ttft_ms_median'], '.0f')} ms median ({f(run['ttft_ms_p90'], '.0f')} p90), per user "
            f"{f(run['user_tps_median'], '.2f')} tok/s median ({f(run['user_tps_min'], '.2f')} min); answers ok "
            f"{c['ok']}/{c['answers']}, own key {c['own_key']}/{c['answers']}{same}; KV "
            f"{f((run.get('kv_bytes') or 0) / MIB, '.1f')} MiB")


# --------------------------------------------------------------------------------------------------- the command
def plan_budget(types: list[str], budget_gib: float, slot_bytes: dict[str, float],
                max_users: int) -> tuple[dict[str, int], dict[str, int]]:
    """Slots that fit in the budget per type (0: not one), and the slots run (those, at most max_users)."""
    fit = {t: slots_for_budget(budget_gib * GIB, slot_bytes[t]) for t in types}
    return fit, {t: min(n, max_users) for t, n in fit.items()}


def run_serve(*, model_path: Path, types: list[str], users: list[int], budget_gib: float | None,
              settings: ServeSettings, out: Path, max_users: int = 256, progress: bool = True,
              prompt_text: str | None = None, argv: list[str] | None = None) -> dict:
    from tqdm import tqdm

    exe = find_tool("llama-server")
    s = settings
    if prompt_text is None:
        from ..eval import model as _model
        prompt_text = _model.bible_text().read_text(errors="replace")
    res = {"status": "running", "started": _dt.datetime.now().isoformat(timespec="seconds"),
           "command": shlex.join(argv) if argv else None,
           "llama_server": {"path": str(exe), "version": tool_version(exe)},
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor()},
           "model": {"path": str(model_path)},
           "settings": {"types": types, "users": users, "budget_gib": budget_gib, "ctx_per_slot": s.ctx,
                        "prompt_tokens": s.prompt_tokens, "n_predict": s.n_predict, "requests_per_user": s.requests,
                        "time_limit_s": s.time_limit, "kv_unified": s.kv_unified, "backend": s.backend,
                        "threads": s.threads, "repack": s.repack, "check": s.check, "max_users": max_users},
           "slot_bytes": {}, "slot_bytes_from": {}, "budget": None, "runs": [], "errors": {}}
    stage = staging_dir(out)
    prompts_cache: list[dict] = []

    def prompts_for(srv, n):
        if len(prompts_cache) < n:   # built once with the first server's tokenizer, extended when more are needed
            prompts_cache[:] = build_prompts(prompt_text, n, s.prompt_tokens, tokenizer_of(srv))
        return prompts_cache[:n]

    n_runs = len(types) * len(users) + (2 * len(types) if budget_gib else 0)
    bar = tqdm(total=n_runs, desc="serve", disable=not progress, dynamic_ncols=True)
    note = bar.set_description if progress else (lambda m: None)
    save = lambda: (stage / "serve.json").write_text(json.dumps(res, indent=1))  # noqa: E731
    done_runs: dict[tuple[str, int], dict] = {}
    with finishing(res, bar, stage, out, lambda: _write_serve_outputs(res, stage, model_path)):
        for t in types:
            for n in users:
                if t in res["errors"]:
                    bar.update(1)
                    continue
                _one(res, exe, s, t, n, prompts_for, stage, note, bar, done_runs, mode="users")
                save()
        if budget_gib:
            for t in types:
                if t in res["errors"]:
                    continue
                if (t, 1) in done_runs and done_runs[(t, 1)].get("kv_bytes"):
                    res["slot_bytes"][t] = done_runs[(t, 1)]["kv_bytes"]
                    res["slot_bytes_from"][t] = f"the log of the {t} run with 1 user"
                else:
                    note(f"{t}: probe start (-np 1 -c {s.ctx}) for the bytes of a slot")
                    log = stage / f"server-{_log_name(t)}-probe.log"
                    try:
                        res["slot_bytes"][t] = probe_slot_bytes(exe, s, t, log)
                        res["slot_bytes_from"][t] = f"a probe start, {log.name}"
                    except ServeError as e:
                        res["errors"][t] = str(e)
                        bar.write(f"[{t}] {e}")
                bar.update(1)
            ok = [t for t in types if t in res["slot_bytes"]]
            fit, plan = plan_budget(ok, budget_gib, res["slot_bytes"], max_users)
            res["budget"] = {"gib": budget_gib, "fit": fit, "slots": plan, "capped_at": max_users}
            save()
            for t in types:
                if t not in plan:
                    bar.update(1)
                    continue
                if plan[t] == 0:
                    res["errors"][f"{t}@budget"] = (f"not one slot of {s.ctx} tokens fits in {budget_gib:g} GiB "
                                                    f"({res['slot_bytes'][t] / MIB:.1f} MiB a slot)")
                    bar.write(f"[{t}] {res['errors'][f'{t}@budget']}")
                    bar.update(1)
                    continue
                prev = done_runs.get((t, plan[t]))
                if prev is not None:   # the very same server and load: not run twice
                    run = dict(prev, mode="budget", budget_gib=budget_gib, same_as_run=f"users={plan[t]}",
                               kv_within_budget=bool(prev.get("kv_bytes")) and prev["kv_bytes"] <= budget_gib * GIB)
                    res["runs"].append(run)
                    bar.write(run_line(run) + f" [the users={plan[t]} run]")
                    bar.update(1)
                else:
                    _one(res, exe, s, t, plan[t], prompts_for, stage, note, bar, done_runs, mode="budget",
                         budget_gib=budget_gib)
                save()
    return res


def _log_name(t: str) -> str:
    return t.replace("/", "-")


def _one(res, exe, s, t, n, prompts_for, stage, note, bar, done_runs, mode, budget_gib=None):
    log = stage / f"server-{_log_name(t)}-np{n}.log"
    try:
        run = run_one(exe, s, t, n, prompts_for, log, note)
    except ServeError as e:
        res["errors"][t if mode == "users" else f"{t}@budget"] = str(e)
        bar.write(f"[{t} x{n}] {e}")
        bar.update(1)
        return
    run["mode"] = mode
    if budget_gib:
        run["budget_gib"] = budget_gib
        run["kv_within_budget"] = bool(run.get("kv_bytes")) and run["kv_bytes"] <= budget_gib * GIB
    done_runs[(t, n)] = run
    res["runs"].append(run)
    bar.write(run_line(run))
    bar.update(1)


# --------------------------------------------------------------------------------------------------- outputs
def render_md(res: dict) -> str:
    s = res["settings"]
    f = lambda v, fmt=".2f": "–" if v is None else format(v, fmt)  # noqa: E731
    md = [f"# turbo-llama bench serve — {Path(res['model']['path']).name}", ""]
    if res["status"] == "interrupted":
        md += ["**interrupted**: the rows below are the runs that finished.", ""]
    m = res["machine"]
    md += [f"`{res['command']}`" if res.get("command") else "", "",
           f"backend {s['backend']}, threads {s['threads']}, {m['cpus']} CPUs ({m['platform']}); "
           f"{Path(res['llama_server']['path']).name}: {res['llama_server']['version']}", "",
           f"Each user: {s['requests_per_user']} request(s) one after another, each a distinct prompt of "
           f"{s['prompt_tokens']} tokens and {s['n_predict']} generated tokens (greedy, streamed), per-slot context "
           f"{s['ctx_per_slot']}, "
           f"{'unified KV cache (-kvu)' if s['kv_unified'] else 'a KV stream per slot (-no-kvu)'}, "
           f"-fa on, at most {s['time_limit_s']:g} s per run.", ""]
    head = ("| cache | users | KV MiB | requests | tok/s (aggregate) | ×f16 | TTFT ms median / p90 | per-user tok/s "
            "median / min | server decode / prompt tok/s | answers ok | own key | same as solo |")
    sep = "|" + "---|" * 12

    def table(runs):
        f16 = {r["users"]: r["agg_tps"] for r in runs if r["type"] == "f16"}
        f16_any = next((r["agg_tps"] for r in runs if r["type"] == "f16"), None)
        lines = [head, sep]
        for r in runs:
            c = r["check"]
            base = f16.get(r["users"]) if r.get("mode") == "users" else f16_any
            ratio = "" if r["type"] == "f16" or not base or not r["agg_tps"] else f"{r['agg_tps'] / base:.2f}"
            lines.append(
                f"| {r['type']} | {r['users']} | {f((r.get('kv_bytes') or 0) / MIB, '.1f')} | {r['completed']}/"
                f"{r['requests']} | {f(r['agg_tps'])} | {ratio} | {f(r['ttft_ms_median'], '.0f')} / "
                f"{f(r['ttft_ms_p90'], '.0f')} | {f(r['user_tps_median'])} / {f(r['user_tps_min'])} | "
                f"{f(r['server_decode_tps_median'])} / {f(r['server_prompt_tps_median'], '.1f')} | "
                f"{c['ok']}/{c['answers']} | {c['own_key']}/{c['answers']} | "
                + (f"{c['same_as_solo']}/{c['solo_compared']}" if c["solo_compared"] else "–") + " |")
        return lines

    eq = [r for r in res["runs"] if r.get("mode") == "users"]
    if eq:
        md += ["## Equal slots per type", "", *table(eq), ""]
    b = res.get("budget")
    if b:
        md += [f"## A fixed cache budget: {b['gib']:g} GiB", "",
               "Slots: as many of " + f"{s['ctx_per_slot']} tokens as fit (at most {b['capped_at']}); the bytes of "
               "a slot from llama's own `llama_kv_cache: size` log line of a 1-slot start: "
               + "; ".join(f"{t} {res['slot_bytes'][t] / MIB:.2f} MiB ({res['slot_bytes_from'][t]}) -> "
                           f"{b['fit'].get(t, 0)} slots fit"
                           + (f", {b['slots'][t]} run" if b["slots"].get(t) != b["fit"].get(t) else "")
                           for t in res["slot_bytes"]) + ".", ""]
        br = [r for r in res["runs"] if r.get("mode") == "budget"]
        if br:
            md += [*table(br), "", "×f16: against f16's run at the same budget.", ""]
    md += ["TTFT: request sent to first streamed token. Per-user tok/s: a request's tokens after its first, over the "
           "time from its first to its last token. Answers ok: text, valid UTF-8, all tokens, and no other request's "
           "key (cross-slot leakage); own key and same-as-solo are reported, not required (answers under load are not "
           "batch-invariant in llama.cpp).", ""]
    probs = [(r, k, v) for r in res["runs"] for k, v in r["check"]["problems"].items()]
    if probs:
        md += ["## Answers with problems", ""] + [f"- {r['type']} x{r['users']}, prompt {k}: {'; '.join(v)}"
                                                  for r, k, v in probs] + [""]
    if res["errors"]:
        md += ["## Errors", ""] + [f"- **{t}**: {m.splitlines()[0]}" for t, m in res["errors"].items()] + [""]
    return "\n".join(md)


def serve_png(runs: list[dict], path: Path, title: str = "") -> Path | None:
    """Aggregate tokens/s against concurrent users, one line per type (the equal-slot runs), budget runs as stars."""
    if not runs:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for t in dict.fromkeys(r["type"] for r in runs):
        pts = sorted((r["users"], r["agg_tps"]) for r in runs if r["type"] == t and r.get("mode") == "users"
                     and r.get("agg_tps"))
        line = None
        if pts:
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=t)
        b = [r for r in runs if r["type"] == t and r.get("mode") == "budget" and r.get("agg_tps")]
        for r in b:
            kw = {"color": line.get_color()} if line is not None else {}
            ax.plot([r["users"]], [r["agg_tps"]], marker="*", markersize=14, linestyle="none",
                           label=f"{t}, {r['budget_gib']:g} GiB budget", **kw)
    users = sorted({r["users"] for r in runs})
    if users and users[-1] >= 8 * users[0]:
        ax.set_xscale("log", base=2)
    ax.set_xticks(users, [str(u) for u in users])
    ax.set_xlabel("concurrent users (server slots)")
    ax.set_ylabel("generated tokens / s (all users)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _write_serve_outputs(res: dict, out: Path, model_path: Path) -> None:
    (out / "serve.json").write_text(json.dumps(res, indent=1))
    (out / "serve.md").write_text(render_md(res))
    try:
        serve_png(res["runs"], out / "serve.png", title=f"llama-server, {Path(model_path).name}")
    except ImportError as e:   # a machine without matplotlib still gets the numbers
        import click
        click.echo(f"note: serve.png not drawn ({e})", err=True)
