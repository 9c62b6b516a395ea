"""turbo-llama build --python, the parts that need no wheel: the ggml.h parser, the Python patch
series, the wheel's CMake options and version."""
from __future__ import annotations

import dataclasses
import re

import pytest

from turbo_llama.build import pywheel as W
from turbo_llama.build.source import load_pin
from turbo_llama.build.tools import BuildOptions, cmake_args
from turbo_llama.ggml_types import kv_type, parse_ggml_types

HEADER = """
    // NOTE: always add types at the end of the enum to keep backward compatibility
    enum ggml_type {
        GGML_TYPE_F32     = 0,
        GGML_TYPE_F16     = 1,
        // GGML_TYPE_Q4_2 = 4, support has been removed
        GGML_TYPE_Q8_0    = 8,
        GGML_TYPE_TURBO3  = 43, // turbo-llama: 3-bit
        GGML_TYPE_TURBO2  = 44, // turbo-llama: 2-bit
        GGML_TYPE_TURBO4  = 45, // a type added later is found without a list to update
        GGML_TYPE_COUNT   = 46,
    };
    enum ggml_prec { GGML_PREC_DEFAULT = 0, };
"""


def test_parse_ggml_types_takes_every_entry_of_the_enum(tmp_path):
    types = parse_ggml_types(HEADER)
    assert types == {"F32": 0, "F16": 1, "Q8_0": 8, "TURBO3": 43, "TURBO2": 44, "TURBO4": 45}
    h = tmp_path / "ggml.h"
    h.write_text(HEADER)
    assert kv_type("turbo4", h) == 45 and kv_type("GGML_TYPE_F16", h) == 1 and kv_type(8, h) == 8
    for bad in ("turbo9", "q4_2", 4, 46, -1):
        with pytest.raises(ValueError, match="known types: f32, f16, q8_0, turbo3, turbo2, turbo4|f32=0"):
            kv_type(bad, h)
    with pytest.raises(TypeError):
        kv_type(4.0, h)


def test_python_patch_series_applies_to_the_pinned_sdist():
    ok, results = W.check_python_patches()
    assert ok, results
    names = [p.name for p in W.python_patches()]
    assert [r[0] for r in results] == names and all(r[1] == "ok" for r in results)
    assert W.python_series_dir().name == f"llama-cpp-python-{load_pin().sdist_version}"


def test_a_python_patch_that_does_not_apply_is_named(tmp_path):
    good = W.python_patches()
    bad = tmp_path / good[1].name
    text = good[1].read_text()
    # break a context line of the first hunk: the patch no longer matches llama_cpp.py
    bad.write_text(text.replace("\n GGML_TYPE_COUNT = 43\n", "\n GGML_TYPE_COUNT = 99\n", 1))
    assert bad.read_text() != text
    ok, results = W.check_python_patches([good[0], bad, *good[2:]])
    assert not ok
    assert results[0][1] == "ok" and results[1][1] == "FAILED" and "llama_cpp/llama_cpp.py" in results[1][2]
    assert all(r[1] == "not tried" for r in results[2:])


def test_wheel_takes_the_cli_builds_cpu_choices():
    pin = load_pin()
    for opts in (BuildOptions(), BuildOptions(native=False), BuildOptions(amx=True)):
        d = W.wheel_defines(opts, pin, None)
        cli = {a[2:].partition("=")[0]: a[2:].partition("=")[2] for a in cmake_args(opts, pin, None)
               if a.startswith("-D")}
        for k in ("GGML_NATIVE", "GGML_CUDA", "LLAMA_BUILD_NUMBER", "LLAMA_BUILD_COMMIT"):
            assert d[k] == cli[k], k
        assert d.get("CMAKE_C_FLAGS") == cli.get("CMAKE_C_FLAGS")
        assert "BUILD_SHARED_LIBS" not in d  # llama-cpp-python's CMakeLists sets it: shared libraries
    d = W.wheel_defines(BuildOptions(cuda=True, cuda_arch="90"), pin, "/usr/local/cuda/bin/nvcc")
    assert d["GGML_CUDA"] == "ON" and d["CMAKE_CUDA_ARCHITECTURES"] == "90"
    d = W.wheel_defines(BuildOptions(extra_cmake=("-DLLAVA_BUILD:BOOL=ON",)), pin, None)
    assert d["LLAVA_BUILD"] == "ON"
    with pytest.raises(Exception, match="-DNAME=VALUE"):
        W.wheel_defines(BuildOptions(extra_cmake=("-G", "Ninja")), pin, None)


def test_wheel_version_is_the_pin_with_a_local_label():
    from packaging.version import Version
    pin = load_pin()
    v = W.wheel_version(pin, "0123456789ab")
    assert v == f"{pin.sdist_version}+turbo.g0123456789ab"
    assert str(Version(v)) == v and Version(v).public == pin.sdist_version


def test_wheel_key_changes_with_each_input():
    pin = load_pin()
    patches = W.python_patches(pin)

    @dataclasses.dataclass
    class P:
        key: str
    base = W.wheel_key(P("a"), pin, patches, "cpu", {"X": "1"})
    assert base == W.wheel_key(P("a"), pin, patches, "cpu", {"X": "1"})
    assert len({base, W.wheel_key(P("b"), pin, patches, "cpu", {"X": "1"}),
                W.wheel_key(P("a"), pin, patches[:-1], "cpu", {"X": "1"}),
                W.wheel_key(P("a"), pin, patches, "cuda-90", {"X": "1"}),
                W.wheel_key(P("a"), pin, patches, "cpu", {"X": "2"})}) == 5
    assert re.fullmatch(r"[0-9a-f]{12}", base)
