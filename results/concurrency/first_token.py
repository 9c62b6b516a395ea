"""First token's top-5 log-probabilities, alone vs beside another request: largest difference, solo margin, same argmax.
Usage: .venv/bin/python results/concurrency/first_token.py f16 turbo3 q4_0
(CPU build of `turbo-llama build`, default model; see README.md here.)"""
import sys, pathlib
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
import test_kv_features as t
from _kv_helpers import server, complete, concurrently
from turbo_llama import model
exe = pathlib.Path.home() / ".cache/turbo-llama/build/cpu/bin/llama-server"
mp = model.default_model()
for ctk in sys.argv[1:]:
    with server(exe, mp, pathlib.Path(f"/tmp/t0-{ctk}.log"), ctk, ctk, ctx=4*512, extra=["-np", "4"]) as srv:
        diffs = []
        for a, b in t.PAIRS:
            s = complete(srv, a, 1, id_slot=0, cache_prompt=False, n_probs=5)["completion_probabilities"][0]["top_logprobs"]
            ra, rb = concurrently([lambda: complete(srv, a, 1, id_slot=0, cache_prompt=False, n_probs=5),
                                   lambda: complete(srv, b, 1, id_slot=1, cache_prompt=False, n_probs=5)])
            c = ra["completion_probabilities"][0]["top_logprobs"]
            sd = {e["id"]: e["logprob"] for e in s}; cd = {e["id"]: e["logprob"] for e in c}
            d = max(abs(sd[k] - cd[k]) for k in sd if k in cd)
            diffs.append((round(d, 5), round(s[0]["logprob"] - s[1]["logprob"], 4), s[0]["id"] == c[0]["id"]))
        print(ctk, diffs, flush=True)
