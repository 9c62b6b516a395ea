"""python -m turbo_llama == turbo-llama"""
from .cli import main

main(prog_name="turbo-llama")
