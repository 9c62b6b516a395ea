"""Slot 0's saved cache (prompt + 1 token) alone vs beside another request vs alone again: differing bytes.
Usage: .venv/bin/python studies/concurrency/prompt_cache_bytes.py f16 q4_0 turbo3
(CPU build of `turbo-llama build`, default model; see README.md here.)"""
import sys, os, pathlib, numpy as np
from _setup import t, server, complete, concurrently, request, exe, mp
for ctk in sys.argv[1:]:
    saves = pathlib.Path(f"/tmp/slots-{ctk}"); saves.mkdir(exist_ok=True)
    with server(exe, mp, pathlib.Path(f"/tmp/kv-{ctk}.log"), ctk, ctk, ctx=4*512,
                extra=["-np", "4", "--slot-save-path", str(saves), "--swa-full"]) as srv:
        tot = []
        for i, (a, b) in enumerate(t.PAIRS):
            complete(srv, a, 1, id_slot=0, cache_prompt=False)
            request(srv, "/slots/0?action=save", {"filename": f"solo{i}.bin"})
            concurrently([lambda: complete(srv, a, 1, id_slot=0, cache_prompt=False),
                          lambda: complete(srv, b, 1, id_slot=1, cache_prompt=False)])
            request(srv, "/slots/0?action=save", {"filename": f"conc{i}.bin"})
            complete(srv, a, 1, id_slot=0, cache_prompt=False)
            request(srv, "/slots/0?action=save", {"filename": f"solo2_{i}.bin"})
            A = np.fromfile(saves / f"solo{i}.bin", np.uint8); B = np.fromfile(saves / f"conc{i}.bin", np.uint8)
            C = np.fromfile(saves / f"solo2_{i}.bin", np.uint8)
            n = min(len(A), len(B))
            tot.append(((A[:n] != B[:n]).sum(), (A != C).sum() if len(A) == len(C) else -1, len(A), len(B)))
        print(ctk, tot, flush=True)
