"""Every SIMD path of the block-quantised kernels, tested on whichever x86-64 CPU runs the tests.

A default build compiles one path, the widest this CPU has (the first test checks that), and the
default run tests that one. So that the others are tested too, this test compiles the five modules
that hold those kernels (qproduct: the type table with every weight type's kernels; quant's half
conversions, matvec's float32 dot, the attention's head and the diff's row scans, from the C that the
install generated) once for each other path, puts them into a copy of the package and runs the kernel
tests there in a child process:
gguf-py's integers and the numpy emulation of ggml's float order, bit for bit
(test_quant_kernels.py, test_kquant_order.py, test_ggml_order.py, test_ggml_attention.py: one
query and a block's groups of queries), block products equal to one product per position
(test_matmul.py: the Q8_0 and float32 tiles), and the diff's metrics equal to metrics.py's numpy
(test_row_metrics.py), and the packed copies' products equal to the mapped file's (test_packed.py).
How each path is built here:

- portable: ``PYLLAMA_PORTABLE=1`` (no instruction set beyond the architecture's base);
- avx2: on an AVX-512 CPU, the native flags with AVX-512 switched off (``-mno-avx512f``);
- avx512 (F+BW, no VNNI): on an AVX-512 VNNI CPU, the native flags with ``-mno-avx512vnni``;
  on a CPU without AVX-512, ``PYLLAMA_EMULATE_AVX512=1`` (build_config.py);
- avx512-vnni: on a CPU without VNNI, ``PYLLAMA_EMULATE_AVX512=vnni``.

The emulation compiles the same source against SIMDe's portable AVX-512 headers: SIMDe's C for each
intrinsic, so it checks the path's arithmetic (lanes, masks, shuffles, the float order), not the CPU.
Each case skips with its reason where it cannot run: not x86-64, the path is the build's own, a CPU
without AVX2 for an AVX-512 path, or no SIMDe headers (Debian: libsimde-dev) where emulation is needed.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from pyllama import build_config
from pyllama.attention.native import compiler_command
from pyllama.kernels.qproduct import built_for_this_cpu, simd_path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "pyllama"
MODULES = (
    "kernels/qproduct",
    "kernels/quant",
    "kernels/matvec",
    "attention/head",
    "diff/_metrics",
)
KERNEL_TESTS = (
    "test_quant_kernels.py",
    "test_kquant_order.py",
    "test_ggml_order.py",
    "test_matmul.py",
    "test_ggml_attention.py",
    "test_row_metrics.py",
    "test_packed.py",
)
PATHS = ("portable", "avx2", "avx512", "avx512-vnni")


def _cpu_flags() -> set[str]:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), set())


def test_the_build_multiplies_with_the_widest_path_the_cpu_has():
    """A default (-march=native) build compiles the AVX-512 kernels on an AVX-512 CPU and the AVX2 ones on
    an AVX2 CPU, so that the kernel tests of this run check the path this machine has."""
    if not built_for_this_cpu():
        pytest.skip("a PYLLAMA_PORTABLE=1 build: no instruction set beyond the architecture's base")
    if simd_path().startswith("avx512") and "avx512f" not in _cpu_flags():
        pytest.skip("a PYLLAMA_EMULATE_AVX512 build (by hand: this file builds its own)")
    if platform.machine() not in ("x86_64", "AMD64"):
        assert simd_path() == "portable"
        return
    flags = _cpu_flags()
    if not flags:
        pytest.skip("no /proc/cpuinfo to read the CPU's instruction sets from")
    want = "portable"
    if {"avx2", "fma"} <= flags:
        want = "avx2"
        if {"avx512f", "avx512bw"} <= flags and not build_config.switches()["PYLLAMA_NO_AVX512"]:
            want = "avx512-vnni" if "avx512_vnni" in flags else "avx512"
    assert simd_path() == want


def recipe(path: str) -> tuple[dict[str, str], list[str]] | str:
    """How to build ``path`` on this machine: (environment switches, extra compiler flags), or why not."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"the SIMD kernels are x86-64 code; this is {platform.machine()}"
    if not built_for_this_cpu():
        return "a PYLLAMA_PORTABLE=1 install: the default run tests the portable path, and no other is built"
    if path == simd_path():
        return f"this build's own path ({path}): the default run's kernel tests check it"
    if not all((PACKAGE / f"{m}.c").exists() for m in MODULES):
        return "the generated C of the kernel modules is not in the checkout (a non-editable install)"
    if path == "portable":
        return {"PYLLAMA_PORTABLE": "1"}, []
    flags = _cpu_flags()
    if not {"avx2", "fma"} <= flags:
        return f"the {path} path needs AVX2 and FMA, which this CPU lacks"
    native_avx512 = {"avx512f", "avx512bw"} <= flags
    if path == "avx2":
        return {}, ["-mno-avx512f"]
    if path == "avx512" and native_avx512:
        return {}, ["-mno-avx512vnni"]
    if not build_config.compiler_has_header(compiler_command(), build_config.SIMDE_HEADER):
        return f"emulating {path} needs SIMDe's headers ({build_config.SIMDE_HEADER}; Debian: libsimde-dev)"
    return {build_config.EMULATE_AVX512: "1" if path == "avx512" else "vnni"}, []


def compile_module(module: str, env: dict[str, str], extra: list[str], out_dir: Path) -> None:
    cfg = build_config.build_config(compiler_command(), env)
    target = out_dir / f"{module}{sysconfig.get_config_var('EXT_SUFFIX')}"
    source = PACKAGE / f"{module}.c"
    includes = [PACKAGE / "kernels", np.get_include(), sysconfig.get_paths()["include"]]
    argv = [*compiler_command(), "-shared", "-fPIC", *cfg.compile_args, *extra, *(f"-I{d}" for d in includes)]
    argv += [str(source), "-o", str(target), *cfg.link_args]
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode == 0, f"{module} did not compile with {env} {extra}:\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("path", PATHS)
def test_each_simd_path_gives_the_kernel_tests_bits(path, tmp_path):
    recipe_or_reason = recipe(path)
    if isinstance(recipe_or_reason, str):
        pytest.skip(recipe_or_reason)
    env_switches, extra = recipe_or_reason
    copy = tmp_path / "pyllama"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("*.c", "__pycache__"), symlinks=True)
    with ThreadPoolExecutor(max_workers=len(MODULES)) as pool:
        list(pool.map(lambda m: compile_module(m, env_switches, extra, copy), MODULES))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "tests")])}
    probe_code = "import pyllama.kernels.qproduct as q; print(q.__file__); print(q.simd_path())"
    probe = subprocess.run([sys.executable, "-c", probe_code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    where, built = probe.stdout.split()
    assert Path(where).is_relative_to(tmp_path) and built == path, probe.stdout
    pytest_args = ["-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path)]
    tests = [str(REPO / "tests" / name) for name in KERNEL_TESTS]
    argv = [sys.executable, "-m", "pytest", *pytest_args, *tests]
    run = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "failed" not in summary, run.stdout[-500:]
