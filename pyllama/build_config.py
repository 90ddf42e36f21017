"""The one build configuration of pyllama's Cython code: compiler flags and Cython directives.

``setup.py`` (the package and its built-in plugins) and :mod:`pyllama.attention.native` (a
researcher's ``file.pyx:Class`` plugin, compiled on first use) both take their settings from here,
so a plugin is compiled exactly like the built-ins it is compared with. This module imports nothing
from pyllama: ``setup.py`` loads it by path, before the package is built.

Environment switches:
  PYLLAMA_PORTABLE=1    no -march=native (a build that runs on any x86-64 / aarch64 machine)
  PYLLAMA_BOUNDSCHECK=1 Cython bounds, wraparound and initialisation checks back on, for debugging
  PYLLAMA_NO_OPENMP=1   serial kernels even if the compiler has OpenMP
  PYLLAMA_NO_AVX512=1   -march=native with AVX-512 switched off: the AVX2 path on an AVX-512 CPU,
                        the whole package (attention included), to time it against an AVX2 peer
  PYLLAMA_EMULATE_AVX512=1 (or =vnni)
                        a test build: the AVX-512 (or AVX-512 VNNI) kernels of the block-quantised
                        types compiled on a CPU that has only AVX2, against SIMDe's portable AVX-512
                        headers (Debian's libsimde-dev), so that either machine can test that path
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SWITCHES = ("PYLLAMA_PORTABLE", "PYLLAMA_BOUNDSCHECK", "PYLLAMA_NO_OPENMP", "PYLLAMA_NO_AVX512")
EMULATE_AVX512 = "PYLLAMA_EMULATE_AVX512"
# its values and the level each compiles (qblocks.h: 1 AVX-512 F+BW, 2 with VNNI)
EMULATE_AVX512_LEVELS = {"1": 1, "vnni": 2}
SIMDE_HEADER = "simde/x86/avx512.h"

# -fno-math-errno: sqrtf/expf become single instructions (nothing reads errno). -fno-trapping-math: the
# compiler may compute both sides of a select (a clamp, a zero below a threshold) and vectorise the
# loop, as it must not when a float operation could trap; nothing here enables FP traps, and no value
# changes. No -ffast-math, which would let the compiler reorder float sums and break bit-identical
# results.
BASE_COMPILE_ARGS = ("-O3", "-fno-math-errno", "-fno-trapping-math")
OPENMP_FLAG = "-fopenmp"
_OPENMP_PROBE = (
    "#include <omp.h>\nint main(void){int n=0;\n#pragma omp parallel\n{n=omp_get_num_threads();}\nreturn n<1;}\n"
)


def switches(env: Mapping[str, str] | None = None) -> dict[str, bool]:
    """Which of the environment switches are on (a value of exactly "1")."""
    env = os.environ if env is None else env
    return {name: env.get(name) == "1" for name in SWITCHES}


def emulated_avx512(env: Mapping[str, str] | None = None) -> int:
    """The AVX-512 level PYLLAMA_EMULATE_AVX512 asks for: 0 (unset), 1 (F+BW) or 2 (with VNNI)."""
    env = os.environ if env is None else env
    value = env.get(EMULATE_AVX512, "")
    if value in ("", "0"):
        return 0
    if value not in EMULATE_AVX512_LEVELS:
        raise ValueError(f"{EMULATE_AVX512}={value!r}: use 1 (AVX-512 F+BW) or vnni (with VNNI)")
    return EMULATE_AVX512_LEVELS[value]


def compiler_has_header(cc: str | Sequence[str], header: str) -> bool:
    """True when the C compiler ``cc`` finds ``header`` on its include path."""
    argv = [cc] if isinstance(cc, str) else list(cc)
    if not argv or shutil.which(argv[0]) is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(f"#include <{header}>\nint main(void){{return 0;}}\n")
        proc = subprocess.run([*argv, "-c", str(src), "-o", str(Path(tmp) / "probe.o")], capture_output=True)
        return proc.returncode == 0


def cython_directives(env: Mapping[str, str] | None = None) -> dict[str, object]:
    """Cython compiler directives: checks off unless PYLLAMA_BOUNDSCHECK=1."""
    checks = switches(env)["PYLLAMA_BOUNDSCHECK"]
    return {
        "language_level": 3,
        "boundscheck": checks,
        "wraparound": checks,
        "initializedcheck": checks,
        "cdivision": True,
        "nonecheck": False,
        "embedsignature": True,
    }


def compiler_has_openmp(cc: str | Sequence[str]) -> bool:
    """True when the C compiler ``cc`` (a command, or its argv) compiles and links a small OpenMP program."""
    argv = [cc] if isinstance(cc, str) else list(cc)
    if not argv or shutil.which(argv[0]) is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(_OPENMP_PROBE)
        proc = subprocess.run([*argv, OPENMP_FLAG, str(src), "-o", str(Path(tmp) / "probe")], capture_output=True)
        return proc.returncode == 0


@dataclass(frozen=True)
class BuildConfig:
    """What one compile of a pyllama Cython module uses."""

    openmp: bool
    compile_args: list[str]
    link_args: list[str]
    directives: dict[str, object] = field(default_factory=dict)
    no_openmp_reason: str = ""  # why openmp is off, for the build's warning

    @property
    def cache_tag(self) -> str:
        """A short text that changes whenever the compiled code would."""
        return "-".join(
            [*self.compile_args, *self.link_args, *(f"{k}={v}" for k, v in sorted(self.directives.items()))]
        )


def build_config(cc: str | Sequence[str], env: Mapping[str, str] | None = None) -> BuildConfig:
    """The flags and directives for compiler ``cc`` under the environment switches."""
    on = switches(env)
    args = list(BASE_COMPILE_ARGS)
    if not on["PYLLAMA_PORTABLE"]:
        # the define lets a module say that it was built for this CPU (qproduct.built_for_this_cpu)
        args += ["-march=native", "-DPYLLAMA_MARCH_NATIVE"]
        if on["PYLLAMA_NO_AVX512"]:
            args.append("-mno-avx512f")  # after -march=native, so it wins; takes every AVX-512 subset with it
    reason = ""
    if on["PYLLAMA_NO_OPENMP"]:
        openmp, reason = False, "PYLLAMA_NO_OPENMP=1"
    else:
        openmp = compiler_has_openmp(cc)
        reason = "" if openmp else "the compiler cannot build OpenMP code"
    link = [OPENMP_FLAG] if openmp else []
    if openmp:
        args.append(OPENMP_FLAG)
    level = emulated_avx512(env)
    if level:
        if not compiler_has_header(cc, SIMDE_HEADER):
            raise RuntimeError(
                f"{EMULATE_AVX512} needs SIMDe's headers ({SIMDE_HEADER}); install them (Debian: libsimde-dev)"
            )
        # -Wno-psabi: gcc notes, once per emulated function, that 64-byte vector arguments changed ABI in 4.6
        args += [f"-DPYLLAMA_EMULATE_AVX512={level}", "-Wno-psabi"]
    return BuildConfig(openmp, args, link, cython_directives(env), reason)
