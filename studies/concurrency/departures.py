"""Issue #7 measurement: tests/test_kv_features.py's departures() for each spec CTK/CTV[:ENV=VALUE].
Usage: .venv/bin/python studies/concurrency/departures.py f16/f16 turbo3/turbo3 turbo3/turbo3:TURBO_K_OFFSET=0
(CPU build of `turbo-llama build`, default model; see README.md here.)"""
import sys, os, statistics, pathlib
from _setup import t, mp, exe
for spec in sys.argv[1:]:
    kv, _, env = spec.partition(":")
    ctk, ctv = kv.split("/")
    saved = dict(os.environ)
    if env:
        k, v = env.split("="); os.environ[k] = v
    d = t.departures(exe, mp, pathlib.Path(f"/tmp/{ctk}-{ctv}-{env}.log"), ctk, ctv)
    os.environ.clear(); os.environ.update(saved)
    print(spec, d, f"{statistics.mean(d):.2f}", flush=True)
