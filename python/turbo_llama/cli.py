"""The turbo-llama command.

Commands live in their packages' cli modules (build/cli.py, eval/cli.py, bench/cli.py) and in info.py;
this file only registers them, lazily (a module is imported when its command runs or help is shown), so
one broken module never breaks the others.

To add a command: write a click command in your module, then add one line to COMMANDS below:
    "name": "turbo_llama.<package>.cli:<click command object>",
(or, eagerly: ``from turbo_llama.cli import main; main.add_command(cmd)``).
"""
import importlib

import click

COMMANDS = {
    "build": "turbo_llama.build.cli:build_command",
    "prepare": "turbo_llama.build.cli:prepare_command",
    "patches": "turbo_llama.build.cli:patches_group",
    "info": "turbo_llama.info:info_command",
    "eval": "turbo_llama.eval.cli:eval_command",
    "bench": "turbo_llama.bench.cli:bench_command",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        names = set(super().list_commands(ctx))
        names.update(n for n in COMMANDS if self._load(n, quiet=True) is not None)
        return sorted(names)

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        return cmd if cmd is not None else self._load(name)

    def _load(self, name, quiet=False):
        target = COMMANDS.get(name)
        if target is None:
            return None
        mod, _, attr = target.partition(":")
        try:
            return getattr(importlib.import_module(mod), attr)
        except ModuleNotFoundError as e:
            if e.name == mod or quiet:   # not written yet: the command simply does not exist
                return None
            raise
        except (ImportError, AttributeError):
            if quiet:
                return None
            raise


@click.group(cls=LazyGroup)
@click.version_option(package_name="turbo-llama")
def main():
    """Build llama.cpp with the turbo3/turbo2 KV-cache types, and evaluate them."""
