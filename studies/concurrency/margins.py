"""Top-1 minus top-2 log-probability margins along the 16 solo greedy answers of the test's prompts.
Usage: .venv/bin/python studies/concurrency/margins.py f16 q4_0 q8_0 turbo3 turbo2
(CPU build of `turbo-llama build`, default model; see README.md here.)"""
import sys, os, pathlib, math, statistics, json
from _setup import t, server, complete, exe, mp
res = {}
for ctk in sys.argv[1:]:
    with server(exe, mp, pathlib.Path(f"/tmp/m-{ctk}.log"), ctk, ctk, ctx=4*512, extra=["-np", "4"]) as srv:
        ms = []
        for pair in t.PAIRS:
            for p in pair:
                r = complete(srv, p, t.N, cache_prompt=False, n_probs=2)
                cp = r["completion_probabilities"]
                m = []
                for e in cp:
                    top = e["top_logprobs"]
                    m.append(top[0]["logprob"] - top[1]["logprob"] if len(top) > 1 else 99)
                ms.append(m)
        res[ctk] = ms
        allm = [x for m in ms for x in m]
        mins = [min(m) for m in ms]
        print(ctk, "tokens with margin <0.01:", sum(x < 0.01 for x in allm), "<0.05:", sum(x < 0.05 for x in allm),
              "<0.2:", sum(x < 0.2 for x in allm), "of", len(allm), "median margin", f"{statistics.median(allm):.3f}",
              "per-prompt min margin median", f"{statistics.median(mins):.3f}", flush=True)
json.dump(res, open("/tmp/margins.json", "w"))
