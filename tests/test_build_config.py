"""One build configuration: setup.py and the .pyx plugin compiler use the same flags and directives
(pyllama/build_config.py) under every PYLLAMA_* switch, and the plugin compiler really applies them."""

from __future__ import annotations

import importlib.util
import runpy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pyllama import build_config
from pyllama.attention import native

REPO = Path(__file__).resolve().parents[1]
SETTINGS = [
    {},
    {"PYLLAMA_PORTABLE": "1"},
    {"PYLLAMA_BOUNDSCHECK": "1"},
    {"PYLLAMA_NO_OPENMP": "1"},
    {"PYLLAMA_NO_AVX512": "1"},
]


def _switch_env(monkeypatch, env: dict[str, str]) -> None:
    for name in (*build_config.SWITCHES, build_config.EMULATE_AVX512):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def _what_setup_builds_with(monkeypatch) -> tuple[dict, list[str], list[str]]:
    """Run setup.py with cythonize() and setup() stubbed: its directives and the flags of its build_ext."""
    import Cython.Build
    import setuptools
    from setuptools import Extension
    from setuptools.command.build_ext import build_ext

    seen: dict = {}
    monkeypatch.setattr(Cython.Build, "cythonize", lambda exts, **kw: seen.update(kw) or [])
    monkeypatch.setattr(setuptools, "setup", lambda **kw: seen.update(cmdclass=kw["cmdclass"]))
    runpy.run_path(str(REPO / "setup.py"), run_name="setup_under_test")
    command = seen["cmdclass"]["build_ext"].__new__(seen["cmdclass"]["build_ext"])
    command.compiler = SimpleNamespace(compiler_so=native.compiler_command())
    ext = Extension("probe", ["probe.pyx"])
    command.extensions = [ext]
    monkeypatch.setattr(build_ext, "build_extensions", lambda self: None)
    command.build_extensions()
    return seen["compiler_directives"], ext.extra_compile_args, ext.extra_link_args


@pytest.mark.parametrize("env", SETTINGS, ids=lambda e: ",".join(e) or "default")
def test_setup_and_the_plugin_compiler_agree(monkeypatch, env):
    _switch_env(monkeypatch, env)
    directives, compile_args, link_args = _what_setup_builds_with(monkeypatch)
    plugin = native.plugin_build_config()
    assert plugin.directives == directives
    assert plugin.compile_args == compile_args and plugin.link_args == link_args
    checks = env.get("PYLLAMA_BOUNDSCHECK") == "1"
    assert (directives["boundscheck"], directives["wraparound"], directives["initializedcheck"]) == (checks,) * 3
    assert ("-march=native" in compile_args) == (env.get("PYLLAMA_PORTABLE") != "1")
    if env.get("PYLLAMA_NO_OPENMP") == "1":
        assert "-fopenmp" not in compile_args and not link_args
    if env.get("PYLLAMA_NO_AVX512") == "1":  # after -march=native, or the native flags would turn it back on
        assert compile_args.index("-mno-avx512f") > compile_args.index("-march=native")
    else:
        assert "-mno-avx512f" not in compile_args
    assert "-ffast-math" not in compile_args  # bit-identical results need IEEE order of operations


def test_the_switches_change_the_plugin_cache_key(monkeypatch):
    tags = set()
    for env in SETTINGS:
        _switch_env(monkeypatch, env)
        tags.add(native.plugin_build_config().cache_tag)
    assert len(tags) == len(SETTINGS)


CHECKED = """
def read(double[::1] x, Py_ssize_t i):
    return x[i]
"""


def test_boundscheck_reaches_a_compiled_plugin(monkeypatch, tmp_path):
    """PYLLAMA_BOUNDSCHECK=1 turns Cython's index checks on in a .pyx compiled by the plugin compiler."""
    _switch_env(monkeypatch, {"PYLLAMA_BOUNDSCHECK": "1", "PYLLAMA_PORTABLE": "1"})
    src = tmp_path / "checked_read.pyx"
    src.write_text(CHECKED)
    built = native.build_pyx(src, "checked_read.pyx", cache=tmp_path / "cache")
    spec = importlib.util.spec_from_file_location(built.name.split(".", 1)[0], built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = np.arange(4, dtype=np.float64)
    assert module.read(x, 3) == 3.0
    with pytest.raises(IndexError):
        module.read(x, 4)


def test_emulated_avx512_levels_and_errors(monkeypatch):
    """PYLLAMA_EMULATE_AVX512 (a test build of the AVX-512 quant kernels) takes 1 or vnni, adds its define
    to setup's flags only (plugins never include those kernels), and says what is missing."""
    assert build_config.emulated_avx512({}) == 0
    assert build_config.emulated_avx512({build_config.EMULATE_AVX512: "1"}) == 1
    assert build_config.emulated_avx512({build_config.EMULATE_AVX512: "vnni"}) == 2
    with pytest.raises(ValueError, match="use 1 .* or vnni"):
        build_config.emulated_avx512({build_config.EMULATE_AVX512: "avx512"})
    monkeypatch.setattr(build_config, "compiler_has_header", lambda cc, header: True)
    cfg = build_config.build_config(native.compiler_command(), {build_config.EMULATE_AVX512: "vnni"})
    assert "-DPYLLAMA_EMULATE_AVX512=2" in cfg.compile_args
    monkeypatch.setattr(build_config, "compiler_has_header", lambda cc, header: False)
    with pytest.raises(RuntimeError, match="libsimde-dev"):
        build_config.build_config(native.compiler_command(), {build_config.EMULATE_AVX512: "1"})


def test_header_probe_finds_a_standard_header_and_not_a_missing_one():
    cc = native.compiler_command()
    assert build_config.compiler_has_header(cc, "stdint.h")
    assert not build_config.compiler_has_header(cc, "pyllama_no_such_header_anywhere.h")
