"""First token's top-5 log-probabilities, alone vs beside another request: largest difference, solo margin, same argmax.
Usage: .venv/bin/python studies/concurrency/first_token.py f16 turbo3 q4_0
(CPU build of `turbo-llama build`, default model; see README.md here.)"""
import sys, pathlib
from _setup import t, server, complete, concurrently, exe, mp, first_logprobs
for ctk in sys.argv[1:]:
    with server(exe, mp, pathlib.Path(f"/tmp/t0-{ctk}.log"), ctk, ctk, ctx=4*512, extra=["-np", "4"]) as srv:
        diffs = []
        for a, b in t.PAIRS:
            rs = complete(srv, a, 1, id_slot=0, cache_prompt=False, n_probs=5)
            s = rs["completion_probabilities"][0]["top_logprobs"]
            ra, rb = concurrently([lambda: complete(srv, a, 1, id_slot=0, cache_prompt=False, n_probs=5),
                                   lambda: complete(srv, b, 1, id_slot=1, cache_prompt=False, n_probs=5)])
            c = ra["completion_probabilities"][0]["top_logprobs"]
            sd, cd = first_logprobs(rs), first_logprobs(ra)
            d = max(abs(sd[k] - cd[k]) for k in sd if k in cd)
            diffs.append((round(d, 5), round(s[0]["logprob"] - s[1]["logprob"], 4), s[0]["id"] == c[0]["id"]))
        print(ctk, diffs, flush=True)
