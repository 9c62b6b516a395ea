"""turbo-llama bench serve: slots for a budget, the statistics, SSE parsing, the prompts and the answer check, the
client against a fake streaming server, the errors of a server that cannot start, and one tiny real run."""
from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from turbo_llama.bench import serve

DATA = Path(__file__).parent / "data"

# two lines of a real llama-server -lv 4 log (Gemma 3 270M, turbo3, -np 2 -c 1024 -no-kvu): the iSWA model's two caches
KV_LOG = (
    "0.01.449.504 I llama_kv_cache: size =    0.61 MiB (   512 cells,   3 layers,  2/2 seqs), "
    "K (turbo3):    0.31 MiB, V (turbo3):    0.30 MiB\n"
    "0.01.449.918 I llama_kv_cache: size =    5.48 MiB (   512 cells,  15 layers,  2/2 seqs), "
    "K (q8_0):    3.98 MiB, V (turbo3):    1.49 MiB\n")


# ----------------------------------------------------------------------------------------------- slots for a budget
def test_slots_for_budget():
    mib = serve.MIB
    assert serve.slots_for_budget(10 * mib, 3 * mib) == 3
    assert serve.slots_for_budget(9 * mib, 3 * mib) == 3          # an exact fit is a fit
    assert serve.slots_for_budget(2 * mib, 3 * mib) == 0
    assert serve.slots_for_budget(100 * mib, 1 * mib, max_slots=8) == 8
    with pytest.raises(ValueError):
        serve.slots_for_budget(1.0, 0)


def test_plan_budget_from_the_log_lines():
    """The bytes of a slot are llama's own (both caches of an iSWA model summed); a 2-slot start costs 6.09 MiB."""
    b = serve.kv_bytes(KV_LOG)
    assert b == pytest.approx((0.61 + 5.48) * serve.MIB)
    assert serve.kv_bytes("no cache here") is None
    slot = {"f16": 4.5 * serve.MIB, "turbo3": b / 2}
    fit, run = serve.plan_budget(["f16", "turbo3"], 0.005, slot, max_users=2)
    assert fit == {"f16": 1, "turbo3": 1}   # 5.12 MiB: 3.05 MiB a turbo3 slot
    fit, run = serve.plan_budget(["f16", "turbo3"], 0.01, slot, max_users=2)
    assert fit == {"f16": 2, "turbo3": 3} and run == {"f16": 2, "turbo3": 2}


# ----------------------------------------------------------------------------------------------- statistics
def test_percentile_matches_numpy():
    xs = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    for q in (0, 10, 50, 90, 100):
        assert serve.percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    assert serve.percentile([], 50) is None and serve.percentile([4.0], 90) == 4.0


def _rec(prompt, t_send, t_first, t_last, n, tps=None, err=None, **kw):
    r = {"prompt": prompt, "t_send": t_send, "t_first": t_first, "t_last": t_last, "t_end": t_last, "n_tokens": n,
         "n_prompt": 10, "error": err, "timings": {"predicted_per_second": tps or 0.0, "prompt_per_second": 100.0}}
    if t_first is not None and n > 1:
        r["decode_tps"] = (n - 1) / (t_last - t_first)
    r.update(kw)
    return r


def test_summarize_run():
    recs = [_rec(0, 0.0, 0.5, 2.5, 9, tps=4.0), _rec(1, 0.0, 1.5, 3.5, 5, tps=2.0),
            _rec(2, 0.0, None, None, 0, err="boom")]
    s = serve.summarize_run(recs, wall_s=4.0)
    assert s["requests"] == 3 and s["completed"] == 2 and s["failed"] == 1
    assert s["generated_tokens"] == 14 and s["agg_tps"] == pytest.approx(3.5)
    assert s["ttft_ms_median"] == pytest.approx(1000.0) and s["ttft_ms_p90"] == pytest.approx(1400.0)
    assert s["user_tps_median"] == pytest.approx(3.0) and s["user_tps_min"] == pytest.approx(2.0)
    assert s["server_decode_tps_median"] == pytest.approx(3.0) and s["prompt_tokens"] == 20


# ----------------------------------------------------------------------------------------------- SSE
def test_iter_sse():
    lines = [b'data: {"content": "a", "tokens": [1]}\n', b"\n", b": keep-alive\n", b"\n",
             'data: {"content": "b",\n', 'data: "tokens": [2]}\n', "\n",
             b'error: {"code": 500, "message": "oops"}\n', b"\n",
             b"data: not json\n", b"\n", b"data: [DONE]\n", b"\n", b'data: {"after": "done"}\n']
    evs = list(serve.iter_sse(lines))
    assert evs == [("data", {"content": "a", "tokens": [1]}), ("data", {"content": "b", "tokens": [2]}),
                   ("error", {"code": 500, "message": "oops"}), ("data", "not json")]
    # the last event needs no blank line after it; CRLF line ends
    assert list(serve.iter_sse([b'data: {"x": 1}\r\n'])) == [("data", {"x": 1})]


# ----------------------------------------------------------------------------------------------- prompts and checks
def _fake_tokenize(text, add_special):
    return ([1] if add_special else []) + [ord(c) for c in text]


def test_prompts_exact_length_distinct_with_their_key():
    text = " ".join(f"word{i}" for i in range(3000))
    ps = serve.build_prompts(text, 6, 80, _fake_tokenize)
    assert all(len(p["tokens"]) == 80 and p["tokens"][0] == 1 for p in ps)
    assert len({tuple(p["tokens"]) for p in ps}) == 6 and len({p["key"] for p in ps}) == 6
    for p in ps:
        assert "".join(map(chr, p["tokens"][1:])).endswith(serve.key_line(p["key"]))
    assert serve.build_prompts(text, 9, 80, _fake_tokenize)[:6] == ps   # the same prompts for every n
    with pytest.raises(ValueError, match="too short for the key line"):
        serve.build_prompts(text, 1, 30, _fake_tokenize)


def test_keys_are_distinct_and_whole():
    keys = [serve.request_key(i) for i in range(2000)]
    assert len(set(keys)) == 2000
    assert serve._has_key(" Heron-1000. Code:", "Heron-1000")
    assert not serve._has_key(" Heron-10001", "Heron-1000") and not serve._has_key("xHeron-1000", "Heron-1000")


def test_check_answer():
    keys = ["Heron-1000", "Falcon-8919"]
    ok = {"content": " Heron-1000. Code: Heron", "n_tokens": 8, "timings": {"predicted_per_second": 3.0}}
    assert serve.check_answer(ok, 8, keys[0], keys) == []
    assert serve.check_answer(dict(ok, content="  "), 8, keys[0], keys)[0] == "empty answer"
    assert "U+FFFD" in serve.check_answer(dict(ok, content="ab\ufffd"), 8, keys[0], keys)[0]
    assert "not 8" in serve.check_answer(dict(ok, n_tokens=3), 8, keys[0], keys)[0]
    assert "non-finite" in serve.check_answer(dict(ok, timings={"x": float("nan")}), 8, keys[0], keys)[0]
    leak = serve.check_answer(dict(ok, content=" Falcon-8919. Code:"), 8, keys[0], keys)
    assert leak and "leakage" in leak[0] and "Falcon-8919" in leak[0]
    assert serve.check_answer({"error": "HTTP 500"}, 8, keys[0], keys) == ["error: HTTP 500"]


# ----------------------------------------------------------------------------------------------- the client
class _FakeLlama(http.server.BaseHTTPRequestHandler):
    """/completion streamed like llama-server: one event per token (tokens [k]), 20 ms apart, then the final event."""
    protocol_version = "HTTP/1.1"
    active = 0
    peak = 0
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["prompt"] == [666]:
            self.send_response(500)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"bad!")
            return
        with _FakeLlama.lock:
            _FakeLlama.active += 1
            _FakeLlama.peak = max(_FakeLlama.peak, _FakeLlama.active)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        n = body["n_predict"]
        word = f" p{body['prompt'][0]}"
        for k in range(n):
            time.sleep(0.02)
            self.wfile.write(f'data: {json.dumps({"content": word, "tokens": [k], "stop": False})}\n\n'.encode())
            self.wfile.flush()
        final = {"content": "", "tokens": [], "stop": True, "tokens_predicted": n, "tokens_evaluated": 3,
                 "id_slot": 0, "timings": {"predicted_per_second": 50.0, "prompt_per_second": 500.0}}
        self.wfile.write(f"data: {json.dumps(final)}\n\n".encode())
        self.wfile.flush()
        self.close_connection = True
        with _FakeLlama.lock:
            _FakeLlama.active -= 1


@pytest.fixture
def fake_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeLlama)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    _FakeLlama.peak = 0
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_stream_completion_times_and_tokens(fake_server):
    r = serve.stream_completion(fake_server, serve.completion_payload([7, 1, 2], 5), timeout=10)
    assert r["error"] is None and r["n_tokens"] == 5 and r["n_stream"] == 5 and r["content"] == " p7" * 5
    assert r["t_send"] < r["t_first"] < r["t_last"] <= r["t_end"]
    assert r["t_first"] - r["t_send"] >= 0.015                 # the first token's 20 ms
    assert 10 < r["decode_tps"] < 60                              # 4 tokens in ~80 ms
    assert r["timings"]["predicted_per_second"] == 50.0 and r["id_slot"] == 0
    bad = serve.stream_completion(fake_server, serve.completion_payload([666], 5), timeout=10)
    assert bad["error"].startswith("HTTP 500") and bad["n_tokens"] == 0


def test_drive_clients_concurrent_and_bounded(fake_server):
    prompts = [[i] for i in range(12)]
    recs, wall = serve.drive_clients(fake_server, prompts, users=3, requests_per_user=2, n_predict=4,
                                     time_limit=60, request_timeout=10)
    assert [r["prompt"] for r in recs] == list(range(6)) and _FakeLlama.peak == 3
    assert {r["user"] for r in recs} == {0, 1, 2} and all(r["content"] == f" p{r['prompt']}" * 4 for r in recs)
    assert 0.15 < wall < 5
    # the time limit: no request starts after it (each client's first one does)
    recs, _ = serve.drive_clients(fake_server, prompts, users=2, requests_per_user=6, n_predict=4, time_limit=0.01,
                                  request_timeout=10)
    assert [r["prompt"] for r in recs] == [0, 1]


# ----------------------------------------------------------------------------------------------- report
def _run(t, users, tps, mode="users", **kw):
    return {"type": t, "users": users, "mode": mode, "agg_tps": tps, "kv_bytes": 4 * users * serve.MIB,
            "requests": users, "completed": users, "ttft_ms_median": 100.0, "ttft_ms_p90": 120.0,
            "user_tps_median": tps / users, "user_tps_min": tps / users / 2, "server_decode_tps_median": 5.0,
            "server_prompt_tps_median": 50.0, **kw,
            "check": {"answers": users, "ok": users, "problems": {}, "own_key": users, "solo_compared": users,
                      "same_as_solo": users - 1}}


def test_markdown_and_plot(tmp_path):
    runs = [_run("f16", 1, 10.0), _run("f16", 2, 16.0), _run("turbo3", 1, 11.0), _run("turbo3", 2, 20.0),
            _run("f16", 2, 16.0, mode="budget", budget_gib=0.01),
            _run("turbo3", 4, 30.0, mode="budget", budget_gib=0.01)]
    res = {"status": "done", "command": "turbo-llama bench serve --users 1,2", "model": {"path": "/m/x.gguf"},
           "machine": {"cpus": 2, "platform": "Linux"}, "llama_server": {"path": "/b/llama-server", "version": "v"},
           "settings": {"requests_per_user": 1, "prompt_tokens": 40, "n_predict": 8, "ctx_per_slot": 256,
                        "kv_unified": False, "time_limit_s": 60, "backend": "cpu", "threads": 1},
           "slot_bytes": {"f16": 4.5 * serve.MIB, "turbo3": 1.5 * serve.MIB},
           "slot_bytes_from": {"f16": "run", "turbo3": "run"},
           "budget": {"gib": 0.01, "fit": {"f16": 2, "turbo3": 6}, "slots": {"f16": 2, "turbo3": 4}, "capped_at": 4},
           "runs": runs, "errors": {"q4_0": "llama-server failed to start\nlog tail"}}
    md = serve.render_md(res)
    assert "## Equal slots per type" in md and "## A fixed cache budget: 0.01 GiB" in md
    assert "| turbo3 | 2 | 8.0 | 2/2 | 20.00 | 1.25 |" in md       # x f16 at the same number of users
    assert "| turbo3 | 4 | 16.0 | 4/4 | 30.00 | 1.88 |" in md       # x f16 at the same budget
    assert "6 slots fit, 4 run" in md and "**q4_0**: llama-server failed to start" in md
    p = serve.serve_png(runs, tmp_path / "serve.png", title="t")
    assert p.stat().st_size > 5000


# ----------------------------------------------------------------------------------------------- errors
FAIL_SERVER = """#!{python}
import sys
if "--version" in sys.argv:
    print("version: fake"); sys.exit(0)
print("loading the model ...")
print("error: this fake server refuses to start", file=sys.stderr)
sys.exit(3)
"""


def _settings(model, **kw):
    return serve.ServeSettings(**{**dict(model=model, ctx=256, prompt_tokens=40, n_predict=8, requests=1,
                                         time_limit=60, kv_unified=False, backend="cpu", threads=1, repack=False,
                                         check=True, start_timeout=30), **kw})


def test_a_server_that_fails_to_start_names_its_log(tmp_path):
    exe = tmp_path / "llama-server"
    exe.write_text(FAIL_SERVER.format(python=sys.executable))
    exe.chmod(0o755)
    log = tmp_path / "server.log"
    with pytest.raises(serve.ServeError) as e:
        serve.start_server(exe, _settings(tmp_path / "m.gguf"), "turbo3", 2, log)
    msg = str(e.value)
    assert "failed to start" in msg and str(log) in msg and "refuses to start" in msg and "-np 2" in msg


def test_a_busy_port_is_refused(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(serve.ServeError, match=f"port {port} on 127.0.0.1 is busy"):
            serve.start_server(tmp_path / "llama-server", _settings(tmp_path / "m.gguf", port=port), "f16", 1,
                               tmp_path / "l.log")


def test_cli_refuses_before_any_run(tmp_path):
    from click.testing import CliRunner
    from turbo_llama.bench.cli import bench_command
    r = CliRunner().invoke(bench_command, ["serve", "--users", "", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "nothing to run" in r.output
    r = CliRunner().invoke(bench_command, ["serve", "--ctx", "256", "--prompt-tokens", "200", "-n", "100"])
    assert r.exit_code == 2 and "do not fit" in r.output
    r = CliRunner().invoke(bench_command, ["serve", "--users", "1,x"])
    assert r.exit_code == 2 and "--users" in r.output
    r = CliRunner().invoke(bench_command, ["serve", "--model", str(tmp_path / "none.gguf"), "--types", "f16"])
    assert r.exit_code == 1 and "no such file" in r.output
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------------------------- one real run
@pytest.mark.slow
def test_serve_tiny_real_run(tmp_path, model_path, llama_tool, monkeypatch):
    """The default model on the CPU: f16 and turbo3 with 1 and 2 users, and a budget of 5.12 MiB (f16: 1 slot of
    256 tokens, turbo3: 3, run as 2 by --max-users 2, so both budget runs are the equal-slot runs' and no server
    starts for them). Every answer is text with its own key and no other; the outputs are written.
    Without the recent window: at 256 cells a slot's window (64 + n_ubatch rows, at most the slot) holds every cell
    in q8_0 beside its turbo3 codes, so turbo3's slot costs more than f16's (the bench reports that as it is)."""
    monkeypatch.setenv("TURBO_WINDOW", "0")
    from click.testing import CliRunner
    from turbo_llama.bench.cli import bench_command
    llama_tool("llama-server")
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = CliRunner().invoke(bench_command, [
        "serve", "--model", str(model_path), "--types", "f16,turbo3", "--users", "1,2", "--budget-gib", "0.005",
        "--max-users", "2", "--ctx", "256", "--prompt-tokens", "40", "-n", "8", "--requests", "1",
        "--time-limit", "60", "--backend", "cpu", "--threads", "1", "--out", str(out)])
    took = time.monotonic() - t0
    assert r.exit_code == 0, r.output + (str(r.exception) if r.exception else "")
    res = json.loads((out / "serve.json").read_text())
    assert res["status"] == "done" and not res["errors"]
    assert "serve --model " in res["command"] and "--types f16,turbo3 --users 1,2 --budget-gib 0.005" in res["command"]
    eq = {(x["type"], x["users"]): x for x in res["runs"] if x["mode"] == "users"}
    assert set(eq) == {("f16", 1), ("f16", 2), ("turbo3", 1), ("turbo3", 2)}
    for x in res["runs"]:
        assert x["agg_tps"] > 0 and x["user_tps_median"] > 0 and x["ttft_ms_median"] > 0
        assert x["completed"] == x["requests"] == x["users"] and x["check"]["ok"] == x["users"]
        assert x["check"]["slots_used"] == x["users"]   # every slot answered: the users ran side by side
        for q in x["requests_detail"]:
            assert q["content"].strip() and q["n_tokens"] == 8 and q["n_prompt"] == 40
    # the tiny model repeats its key, and only its own, under load too
    assert all(x["check"]["own_key"] == x["users"] for x in res["runs"])
    assert eq[("turbo3", 2)]["kv_bytes"] < eq[("f16", 2)]["kv_bytes"]
    b = res["budget"]
    assert b["fit"]["turbo3"] > b["fit"]["f16"] >= 1 and b["slots"] == {"f16": 1, "turbo3": 2}
    budget = {x["type"]: x for x in res["runs"] if x["mode"] == "budget"}
    assert budget["turbo3"]["users"] > budget["f16"]["users"] and all(x["kv_within_budget"] for x in budget.values())
    md = (out / "serve.md").read_text()
    assert "## Equal slots per type" in md and "## A fixed cache budget" in md and "| turbo3 | 2 |" in md
    assert (out / "serve.png").stat().st_size > 5000
    assert sorted(p.name for p in out.glob("server-*.log")) == [f"server-{t}-np{n}.log" for t in ("f16", "turbo3")
                                                                  for n in (1, 2)]
    print(f"bench serve tiny run: {took:.1f} s")
