"""turbo-llama build --python: the llama-cpp-python wheel on the patched tree, used from Python.

The wheel is built once per session into the cache (a no-op when it is there) and installed into
the interpreter running the tests. Everything that loads llama.cpp runs in a child process, so that
a crash is a failed assertion with the child's output, not a dead test run.
"""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile

import pytest

from _kv_helpers import default_window_rows
from _toolkit import run_cli
from turbo_llama.build import pywheel as W
from turbo_llama.build.tools import BuildOptions
from turbo_llama.ggml_types import ggml_header, ggml_types
from turbo_llama.eval.llama_tools import parse_kv_cache

pytestmark = pytest.mark.slow

PROMPT = "The history of the printing press begins in"
N_PREDICT = 24
THREADS = 2
N_CTX = 1024
# the same settings for llama_cpp.Llama and llama-completion: context, batch, threads, greedy
LLAMA_KW = dict(n_ctx=N_CTX, n_batch=512, n_ubatch=512, n_threads=THREADS, n_threads_batch=THREADS, seed=1)
COMPLETION_ARGS = ["-c", str(N_CTX), "-b", "512", "-ub", "512", "-t", str(THREADS), "-tb", str(THREADS),
                   "--seed", "1", "--temp", "0", "--top-k", "1", "-no-cnv", "--no-warmup", "-fa", "on",
                   "--swa-full"]  # llama_cpp.Llama keeps a full-size SWA cache
# bytes per 128 values: turbo3 50, turbo2 34, f16 256
RATIO = {"turbo3": 50 / 256, "turbo2": 34 / 256}


@pytest.fixture(scope="session")
def wheel():
    """Build (or find) the wheel and install it for this interpreter; the time it took is printed."""
    t0 = time.time()
    res = W.build_wheel(BuildOptions(jobs=THREADS, progress=False), python=sys.executable)
    print(f"\n[pywheel] {res.wheel.name}: {'built' if res.built else 'cached'}, {res.installed}, "
          f"{time.time() - t0:.0f} s", file=sys.stderr)
    return res


def run_py(code: str, *args, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)


GENERATE = r"""
import json, sys
import llama_cpp
model, type_k, type_v, prompt, n, ref = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
kw = json.loads(sys.argv[7])
llm = llama_cpp.Llama(model_path=model, flash_attn=True, type_k=type_k, type_v=type_v, verbose=True, **kw)
prompt_tokens = llm.tokenize(prompt.encode())
out = []
for t in llm.generate(prompt_tokens, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
    if t == llm.token_eos():
        break
    out.append(t)
    if len(out) == n:
        break
ref_tokens = llm.tokenize((prompt + ref).encode())[len(prompt_tokens):] if ref else None
print(json.dumps({"tokens": out, "text": llm.detokenize(out).decode("utf-8", "replace"),
                  "text16": llm.detokenize(out[:16]).decode("utf-8", "replace"),
                  "ref_tokens": ref_tokens, "type_k": llm.context_params.type_k}))
"""


@pytest.fixture(scope="session")
def completions(llama_tool, model_path):
    """llama-completion's greedy continuation of PROMPT, per turbo type."""
    out = {}
    for t in RATIO:
        r = subprocess.run([str(llama_tool("llama-completion")), "-m", str(model_path), "-p", PROMPT,
                            "-n", str(N_PREDICT), "-ctk", t, "-ctv", t, *COMPLETION_ARGS],
                           text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert PROMPT in r.stdout, r.stdout[:500]
        # llama-completion ends its output with "\n\n" (after " [end of text]" when it met one)
        out[t] = r.stdout.split(PROMPT, 1)[1].removesuffix("\n\n").removesuffix(" [end of text]")
    return out


@pytest.fixture(scope="session")
def generations(wheel, model_path, completions):
    """llama_cpp.Llama's greedy continuation and log, per cache type (f16 for the KV size baseline)."""
    out = {}
    for t in ("f16", *RATIO):
        r = run_py(GENERATE, model_path, t, t, PROMPT, N_PREDICT, completions.get(t, ""), json.dumps(LLAMA_KW))
        assert r.returncode == 0, f"llama_cpp with {t} failed (exit {r.returncode}):\n{r.stderr[-4000:]}"
        out[t] = {**json.loads(r.stdout.strip().splitlines()[-1]), "log": r.stderr}
    return out


# ---------------------------------------------------------------- the wheel

def test_wheel_is_built_from_the_patched_tree_and_installed(wheel):
    assert wheel.wheel.is_file() and wheel.installed in ("installed", "already installed")
    assert re.fullmatch(r"\d+\.\d+\.\d+\+turbo\.g[0-9a-f]{12}", wheel.version)
    r = run_py("import importlib.metadata as m; print(m.version('llama_cpp_python'))")
    assert r.stdout.strip() == wheel.version, r.stderr
    names = zipfile.ZipFile(wheel.wheel).namelist()
    for lib in ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so"):
        assert f"llama_cpp/lib/{lib}" in names, names
    assert "llama_cpp/include/ggml.h" in names
    header = zipfile.ZipFile(wheel.wheel).read("llama_cpp/include/ggml.h").decode()
    assert "GGML_TYPE_TURBO3" in header and "GGML_TYPE_TURBO2" in header
    rec = json.loads(wheel.record.read_text())
    assert rec["version"] == wheel.version and rec["patches"] and rec["python_patches"]


def test_second_build_rebuilds_nothing(wheel, tmp_path):
    before = wheel.wheel.read_bytes()
    again = W.build_wheel(BuildOptions(jobs=THREADS, progress=False), python=sys.executable)
    assert not again.built and again.seconds == 0 and again.wheel == wheel.wheel
    assert again.installed == "already installed" and again.wheel.read_bytes() == before
    # the command line, writing the wheel into a directory instead of installing it
    r = run_cli("build", "--python", "--wheel-dir", tmp_path / "wheels")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "nothing rebuilt" in r.stdout, r.stdout
    assert (tmp_path / "wheels" / wheel.wheel.name).read_bytes() == before


# ---------------------------------------------------------------- type ids

def test_type_ids_by_name_come_from_the_built_ggml_h(wheel):
    import turbo_llama
    header = ggml_header()
    types = ggml_types()
    turbo = {n: i for n, i in types.items() if n.startswith("TURBO")}
    assert {"TURBO3", "TURBO2"} <= set(turbo)
    text = header.read_text()
    for name, i in turbo.items():
        assert re.search(rf"GGML_TYPE_{name}\s*=\s*{i}\s*,", text)
        assert getattr(turbo_llama, f"GGML_TYPE_{name}") == i
        assert turbo_llama.kv_type(name.lower()) == i
    assert turbo_llama.kv_type("f16") == 1 and turbo_llama.kv_type("q8_0") == types["Q8_0"]
    # llama_cpp knows the same ids, and the library it loads names them so
    r = run_py("import json, sys, llama_cpp, llama_cpp.llama_cpp as c\n"
               "c._lib.ggml_type_name.argtypes = [c.ctypes.c_int]; c._lib.ggml_type_name.restype = c.ctypes.c_char_p\n"
               "print(json.dumps({n: [getattr(llama_cpp, 'GGML_TYPE_' + n), c._lib.ggml_type_name(i).decode()]\n"
               "                  for n, i in json.loads(sys.argv[1]).items()}))", json.dumps(turbo))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert got == {n: [i, n.lower()] for n, i in turbo.items()}


def test_llama_cpp_kv_cache_types_are_the_command_lines(wheel, llama_tool):
    """llama_cpp.LLAMA_KV_CACHE_TYPES (what Llama and the server accept) is what -ctk/-ctv allow."""
    r = subprocess.run([str(llama_tool("llama-completion")), "--help"], text=True, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    m = re.search(r"--cache-type-k TYPE.*?allowed values: (.*?)\(default", r.stdout, re.S)
    assert m, r.stdout[-3000:]
    cli = [t for t in re.split(r"[,\s]+", m.group(1)) if t]
    p = run_py("import json, llama_cpp; print(json.dumps(llama_cpp.LLAMA_KV_CACHE_TYPES))")
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(json.loads(p.stdout)) == sorted(cli)
    assert {"turbo3", "turbo2"} <= set(cli)


# ---------------------------------------------------------------- generation

@pytest.mark.parametrize("t", list(RATIO))
def test_greedy_text_matches_llama_completion_token_for_token(generations, completions, t):
    g = generations[t]
    assert g["type_k"] == ggml_types()[t.upper()]
    assert len(g["tokens"]) == N_PREDICT
    assert g["text"] == completions[t], (g["text"], completions[t])
    # llama-completion's text, tokenized after the prompt, is exactly the tokens Python generated
    assert g["ref_tokens"] == g["tokens"]
    assert len(re.findall(r"[A-Za-z]{2,}", g["text"])) >= 8, g["text"]


def side_mib(log: str) -> dict:
    """The side tensors of a turbo cache that its size line counts (the KV-cache patch), one stream: per layer, a turbo
    K keeps its key offset (n_embd_k_gqa f32), the scaled q/k gains (2 n_embd_head_k) and cell 0's exact K row
    (n_embd_k_gqa), a turbo V cell 0's exact V row (n_embd_v_gqa); and the recent window's rows. The model's sizes
    from llama's print_info."""
    n = {k: int(re.search(rf"print_info: {k} += (\d+)\n", log).group(1))
         for k in ("n_layer", "n_embd_head_k", "n_embd_k_gqa", "n_embd_v_gqa")}
    k = n["n_layer"] * 4 * (2 * n["n_embd_k_gqa"] + 2 * n["n_embd_head_k"])
    v = n["n_layer"] * 4 * n["n_embd_v_gqa"]
    # and the recent window: its rows of each cache's layers, q8_0 (34 bytes per 32 values) for a turbo side
    for c in parse_kv_cache(log)["caches"]:
        w = c["window"]
        assert w == dict(rows=default_window_rows(N_CTX, c["cells"]), type_k="q8_0", type_v="q8_0"), c
        k += c["layers"] * w["rows"] * n["n_embd_k_gqa"] * 34 // 32
        v += c["layers"] * w["rows"] * n["n_embd_v_gqa"] * 34 // 32
    return {"k_mib": k / 2**20, "v_mib": v / 2**20, "kv_mib": (k + v) / 2**20}


@pytest.mark.parametrize("t", list(RATIO))
def test_kv_cache_size_logged_is_the_types_share_of_f16_and_its_side_tensors(generations, t):
    f16, kv = parse_kv_cache(generations["f16"]["log"]), parse_kv_cache(generations[t]["log"])
    assert f16 and kv, generations[t]["log"][-3000:]
    assert all(c["type_k"] == t and c["type_v"] == t for c in kv["caches"])
    assert [c["cells"] for c in kv["caches"]] == [c["cells"] for c in f16["caches"]]
    side = side_mib(generations[t]["log"])
    assert side["k_mib"] > 0.01   # the test must see the side tensors (Gemma 3: 18 layers of 4 KB)
    # llama prints MiB with two decimals: each printed number is within 0.005 of the true one
    tol = 0.005 * len(kv["caches"]) * (1 + RATIO[t]) + 1e-9
    for part in ("k_mib", "v_mib"):
        assert abs(kv[part] - RATIO[t] * f16[part] - side[part]) <= tol, (part, kv[part], f16[part], side[part])
    assert abs(kv["kv_mib"] - RATIO[t] * f16["kv_mib"] - side["kv_mib"]) <= 2 * tol


# ---------------------------------------------------------------- errors

ERRORS = r"""
import sys, llama_cpp
model = sys.argv[1]
cases = {
    "id 999": dict(type_k=999, type_v=1, flash_attn=True),
    "removed id 4": dict(type_k=1, type_v=4, flash_attn=True),
    "i32 (a type, not a KV cache type)": dict(type_k=llama_cpp.GGML_TYPE_I32, flash_attn=True),
    "q8_K by name": dict(type_k="q8_K", flash_attn=True),
    "name turbo9": dict(type_k="turbo9", type_v="turbo3", flash_attn=True),
    "turbo3 without flash attention": dict(type_k="turbo3", type_v="turbo3", flash_attn=False),
    "turbo2 V without flash attention": dict(type_k=1, type_v=llama_cpp.GGML_TYPE_TURBO2, flash_attn=False),
}
for name, kw in cases.items():
    try:
        llama_cpp.Llama(model_path=model, n_ctx=256, n_threads=2, verbose=False, **kw)
        print(f"{name}|no error")
    except Exception as e:
        print(f"{name}|{type(e).__name__}|{' '.join(str(e).split())}")
"""


def test_bad_type_or_turbo_without_flash_attention_is_a_python_exception(wheel, model_path):
    r = run_py(ERRORS, model_path)
    assert r.returncode == 0, f"crashed (exit {r.returncode}):\n{r.stdout}\n{r.stderr[-3000:]}"
    got = dict(line.split("|", 1) for line in r.stdout.strip().splitlines())
    for name in ("id 999", "removed id 4"):
        assert got[name].startswith("ValueError|"), got[name]
        assert "is not a ggml type id of this llama.cpp build" in got[name] and "turbo3=" in got[name]
    assert got["name turbo9"].startswith("ValueError|") and "turbo3" in got["name turbo9"]
    for name in ("i32 (a type, not a KV cache type)", "q8_K by name"):
        # llama.cpp itself would crash on these caches
        assert got[name].startswith("ValueError|") and "is not a KV cache type" in got[name], got[name]
        assert "turbo3=" in got[name] and "q8_0=" in got[name]
    for name, t in (("turbo3 without flash attention", "turbo3"), ("turbo2 V without flash attention", "turbo2")):
        # the command-line tools' own message, from llama.cpp's log
        assert got[name].startswith("ValueError|Failed to create llama_context"), got[name]
        assert f"the {t} KV cache requires flash attention" in got[name], got[name]


# ---------------------------------------------------------------- the server

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server_extras(wheel):
    """llama-cpp-python's [server] extras from PyPI, installed by `build --python --extra server`."""
    res = W.build_wheel(BuildOptions(jobs=THREADS, progress=False), python=sys.executable, extras=("server",))
    assert not res.built and res.installed == "installed"
    r = run_py("import fastapi, uvicorn, pydantic_settings, sse_starlette, starlette_context")
    assert r.returncode == 0, r.stderr[-3000:]


def test_server_serves_completions_with_turbo_types(server_extras, generations, model_path, tmp_path):
    port = _free_port()
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", str(N_CTX), "--n_threads", str(THREADS),
           "--n_threads_batch", str(THREADS), "--flash_attn", "true", "--type_k", "turbo3", "--type_v", "turbo3"]
    with open(log, "w") as lf:
        proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(240):
            if proc.poll() is not None:
                pytest.fail(f"the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=5).read()
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail(f"the server did not come up:\n{log.read_text()[-3000:]}")
        req = urllib.request.Request(url + "/v1/completions", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"prompt": PROMPT, "max_tokens": 16, "temperature": 0,
                                                      "top_k": 1, "repeat_penalty": 1.0}).encode())
        body = json.loads(urllib.request.urlopen(req, timeout=300).read())
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    text = body["choices"][0]["text"]
    assert text == generations["turbo3"]["text16"], (text, generations["turbo3"]["text16"])
    assert re.search(r"K \(turbo3\).*V \(turbo3\)", log.read_text()), log.read_text()[-3000:]


def test_server_refuses_an_unknown_cache_type(server_extras, model_path):
    r = subprocess.run([sys.executable, "-m", "llama_cpp.server", "--model", str(model_path),
                        "--port", str(_free_port()), "--type_k", "turbo9"],
                       text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    assert r.returncode != 0
    assert "turbo9" in r.stdout and "is not a ggml type of this llama.cpp build" in r.stdout, r.stdout[-3000:]
