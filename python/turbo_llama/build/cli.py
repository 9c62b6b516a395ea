"""The click commands of the build side: `turbo-llama build`, `prepare` and `patches check`."""
from __future__ import annotations

import time
from pathlib import Path

import click

from ..errors import ToolkitError
from .prepare import check_patches, export_tree, prepare, write_tarball
from .pywheel import build_wheel
from .source import load_pin
from .tools import BuildOptions, build


@click.command("build")
@click.option("--cuda", is_flag=True, help="Build the CUDA backend too (needs nvcc).")
@click.option("--cuda-arch", default="90", show_default=True, help="CMAKE_CUDA_ARCHITECTURES.")
@click.option("--jobs", "-j", type=int, default=None, help="Parallel jobs (default: all cores).")
@click.option("--build-dir", type=click.Path(path_type=Path), default=None,
              help="Build directory (default: <cache>/build/cpu or cuda-<arch>).")
@click.option("--prefix", type=click.Path(path_type=Path), default=None,
              help="Install binaries into PREFIX/bin (default: the active venv's bin, else ~/.local/bin).")
@click.option("--llama-src", type=click.Path(path_type=Path), default=None,
              help="Use this llama.cpp tree (must be the pinned commit) instead of downloading it.")
@click.option("--no-install", is_flag=True, help="Build only; do not copy binaries.")
@click.option("--target", "targets", multiple=True, help="Build only these targets (repeatable).")
@click.option("--no-native", is_flag=True, help="Portable binaries (GGML_NATIVE=OFF).")
@click.option("--amx", is_flag=True, help="Keep upstream's AMX matmul in native x86 builds (off by default: it crashed at this pin).")
@click.option("--cmake-arg", "extra", multiple=True, help="Extra cmake argument (repeatable).")
@click.option("--python", "python_wheel", is_flag=True,
              help="Build the llama-cpp-python wheel (the pinned sdist) on the patched tree instead, and "
                   "install it into the active environment.")
@click.option("--wheel-dir", type=click.Path(path_type=Path), default=None,
              help="With --python: write the wheel into DIR instead of installing it.")
@click.option("--extra", "extras", multiple=True,
              help="With --python: also install these extras of llama-cpp-python (e.g. server).")
def build_command(cuda, cuda_arch, jobs, build_dir, prefix, llama_src, no_install, targets, no_native, amx, extra,
                  python_wheel, wheel_dir, extras):
    """Prepare the patched llama.cpp, build its tools and install them."""
    t0 = time.time()
    if (wheel_dir or extras) and not python_wheel:
        raise click.UsageError("--wheel-dir and --extra go with --python")
    if python_wheel:
        if build_dir or prefix or targets:
            raise click.UsageError("--python builds the wheel only: --build-dir, --prefix and --target do not apply")
        r = build_wheel(BuildOptions(cuda=cuda, cuda_arch=cuda_arch, jobs=jobs, llama_src=llama_src,
                                     native=not no_native, amx=amx, extra_cmake=tuple(extra)),
                        wheel_dir=wheel_dir, install=not no_install, extras=tuple(extras))
        where = r.copied_to or (f"installed for {r.python}" if r.installed else r.wheel)
        click.echo(f"{r.wheel.name} ({'CUDA' if cuda else 'CPU'}) in {time.time() - t0:.0f} s"
                   f"{'' if r.built else ' (nothing rebuilt)'}: {where}")
        return
    r = build(BuildOptions(cuda=cuda, cuda_arch=cuda_arch, jobs=jobs, build_dir=build_dir, prefix=prefix,
                           llama_src=llama_src, install=not no_install, targets=list(targets) or None,
                           native=not no_native, amx=amx, extra_cmake=tuple(extra)))
    where = r.bin_dir if r.bin_dir else r.build_dir / "bin"
    click.echo(f"built {len(r.binaries)} tools ({'CUDA' if cuda else 'CPU'}) in {time.time() - t0:.0f} s"
               f"{' (nothing rebuilt)' if r.nothing_rebuilt else ''}: {where}")


@click.command("prepare")
@click.option("--llama-src", type=click.Path(path_type=Path), default=None,
              help="Use this llama.cpp tree (must be the pinned commit) instead of downloading it.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Also export the prepared tree (a git repo: tags pristine, overlay) to DIR.")
@click.option("--tarball", type=click.Path(path_type=Path), default=None,
              help="Also write FILE.tar.gz: the prepared tree without .git, docs/, models/, media/.")
def prepare_command(llama_src, out, tarball):
    """Make the patched llama.cpp tree (pristine + overlay + patch series)."""
    prep = prepare(llama_src)
    click.echo(f"prepared tree: {prep.path} ({len(prep.patches)} patches, key {prep.key})")
    if out:
        click.echo(f"exported: {export_tree(prep, out)}")
    if tarball:
        t = write_tarball(prep, tarball)
        click.echo(f"tarball: {t} ({t.stat().st_size / 2**20:.1f} MiB)")


@click.group("patches")
def patches_group():
    """Work with the patch series."""


@patches_group.command("check")
@click.option("--llama-src", type=click.Path(path_type=Path), default=None,
              help="Check against this llama.cpp tree (must be the pinned commit).")
def patches_check_command(llama_src):
    """Apply overlay + series to a scratch copy of the pin; report per patch (no fuzz, no 3-way)."""
    pin = load_pin()
    ok, results = check_patches(llama_src)
    click.echo(f"llama.cpp {pin.label}, series {pin.series}: {len(results)} patch(es)")
    for r in results:
        click.echo(f"  {r.status:9s} {r.patch}")
        if r.status == "FAILED":
            for line in r.detail.splitlines():
                click.echo(f"            {line}")
    if not ok:
        raise ToolkitError("the patch series does not apply cleanly to the pin")
    click.echo("all patches apply cleanly")
