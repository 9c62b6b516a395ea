"""As first_token.py, also alone twice, alone in another slot, and beside another request twice.
Usage: .venv/bin/python studies/concurrency/first_token_repeat.py f16 turbo3
(CPU build of `turbo-llama build`, default model; see README.md here.)"""
import sys, pathlib
from _setup import t, server, complete, concurrently, exe, mp, first_logprobs
def md(x, y): return round(max(abs(x[k] - y[k]) for k in x if k in y), 5)
for ctk in sys.argv[1:]:
    with server(exe, mp, pathlib.Path(f"/tmp/t0b-{ctk}.log"), ctk, ctk, ctx=4*512, extra=["-np", "4"]) as srv:
        out = []
        for a, b in t.PAIRS[:4]:
            s1 = first_logprobs(complete(srv, a, 1, id_slot=0, cache_prompt=False, n_probs=5))
            s2 = first_logprobs(complete(srv, a, 1, id_slot=0, cache_prompt=False, n_probs=5))
            s3 = first_logprobs(complete(srv, a, 1, id_slot=2, cache_prompt=False, n_probs=5))
            c1 = first_logprobs(concurrently([lambda: complete(srv, a, 1, id_slot=0, cache_prompt=False, n_probs=5),
                                  lambda: complete(srv, b, 1, id_slot=1, cache_prompt=False, n_probs=5)])[0])
            c2 = first_logprobs(concurrently([lambda: complete(srv, a, 1, id_slot=0, cache_prompt=False, n_probs=5),
                                  lambda: complete(srv, b, 1, id_slot=1, cache_prompt=False, n_probs=5)])[0])
            out.append(dict(solo_solo=md(s1, s2), solo_slot2=md(s1, s3), solo_conc=md(s1, c1), conc_conc=md(c1, c2)))
        print(ctk, out, flush=True)
