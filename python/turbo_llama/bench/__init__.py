"""`turbo-llama bench`: llama-bench speed per KV-cache type and depth.

run.py     the sweep, its tables and outputs      cli.py   the click command
shapes.py  random-weight GGUFs in the shapes of real models (speed only)
serve.py   `bench serve`: llama-server under N concurrent streaming users, equal slots or a fixed cache budget
"""
