"""The turbo-llama command."""
import click


@click.group()
@click.version_option(package_name="turbo-llama")
def main():
    """Build llama.cpp with the turbo3/turbo2 KV-cache types, and evaluate them."""
