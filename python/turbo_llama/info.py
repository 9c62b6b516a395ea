"""`turbo-llama info`: the pin, the data files, the cache, the default model and what was built."""
from __future__ import annotations

import json

import click

from .build.installed import installed_info
from .build.source import data_root, load_pin, series_patches
from .cachedir import cache_dir
from .eval.model import default_model_status


@click.command("info")
@click.option("--json", "as_json", is_flag=True, help="Print installed.json as is.")
def info_command(as_json):
    """Show the pin, the source, the patches applied and what was built."""
    pin = load_pin()
    info = installed_info()
    if as_json:
        click.echo(json.dumps(info or {}, indent=1))
        return
    click.echo(f"pin:       llama.cpp {pin.label}, commit {pin.commit}")
    click.echo(f"           tree {pin.tree}; sdist {pin.sdist_filename}")
    click.echo(f"data:      {data_root()} (series {pin.series}: {len(series_patches(pin))} patch(es))")
    click.echo(f"cache:     {cache_dir(create=False)}")
    m = default_model_status()
    if "error" in m:
        click.echo(f"model:     {m['name']}: {m['error']}")
    else:
        click.echo(f"model:     {m['path']}" + ("" if m["ready"] else "  (not assembled yet: `turbo-llama eval` does it)"))
        click.echo(f"           {m['name']} (the default model), sha256 {m['sha256']}")
    if not info:
        click.echo("build:     none yet (run `turbo-llama build`)")
        return
    click.echo(f"source:    {info.get('origin')}: {info.get('source')}")
    click.echo(f"prepared:  {info.get('prepared_key')} ({info.get('prepared_tree')})")
    click.echo(f"patches:   {len(info.get('patches', []))} applied")
    for p in info.get("patches", []):
        click.echo(f"             {p}")
    cuda = f"yes (arch {info.get('cuda_arch')})" if info.get("cuda") else "no"
    click.echo(f"cuda:      {cuda}")
    click.echo(f"build dir: {info.get('build_dir')}  ({info.get('time')})")
    click.echo("binaries:")
    inst = info.get("installed") or {}
    for name, path in (info.get("binaries") or {}).items():
        click.echo(f"  {name:18s} {inst.get(name, path)}")
