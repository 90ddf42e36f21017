"""Build the Cython extensions: every .pyx under pyllama/ and plugins/ (packaged as pyllama.plugins).

Environment switches:
  PYLLAMA_PORTABLE=1    no -march=native (a build that runs on any x86-64 / aarch64 machine)
  PYLLAMA_BOUNDSCHECK=1 Cython bounds and wraparound checks back on, for debugging
  PYLLAMA_NO_OPENMP=1   build serial kernels even if the compiler has OpenMP
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent
PORTABLE = os.environ.get("PYLLAMA_PORTABLE") == "1"
DEBUG_CHECKS = os.environ.get("PYLLAMA_BOUNDSCHECK") == "1"
NO_OPENMP = os.environ.get("PYLLAMA_NO_OPENMP") == "1"


def _compiler_accepts(compiler, flags: list[str]) -> bool:
    """True when ``compiler`` compiles and links a small OpenMP program with ``flags``."""
    src = "#include <omp.h>\nint main(void){int n=0;\n#pragma omp parallel\n{n=omp_get_num_threads();}\nreturn n<1;}\n"
    with tempfile.TemporaryDirectory() as tmp:
        c = Path(tmp) / "probe.c"
        c.write_text(src)
        cc = compiler.compiler_so[0] if hasattr(compiler, "compiler_so") else "cc"
        if shutil.which(cc) is None:
            return False
        proc = subprocess.run([cc, *flags, str(c), "-o", str(Path(tmp) / "probe")], capture_output=True)
        return proc.returncode == 0


class BuildExt(build_ext):
    """Compiler specifics live here: optimisation, -march=native, OpenMP or a warned serial build."""

    def build_extensions(self):
        compile_args = ["-O3", "-fno-math-errno"]
        if not PORTABLE:
            compile_args.append("-march=native")
        link_args = []
        openmp = not NO_OPENMP and _compiler_accepts(self.compiler, ["-fopenmp"])
        if openmp:
            compile_args.append("-fopenmp")
            link_args.append("-fopenmp")
        else:
            reason = "PYLLAMA_NO_OPENMP=1" if NO_OPENMP else "the compiler cannot build OpenMP code"
            print(
                f"WARNING: pyllama is being built WITHOUT OpenMP ({reason}): kernels run on one thread "
                "and --threads has no effect.",
                file=sys.stderr,
            )
        for ext in self.extensions:
            ext.extra_compile_args = list(ext.extra_compile_args or []) + compile_args
            ext.extra_link_args = list(ext.extra_link_args or []) + link_args
        super().build_extensions()


def _extensions() -> list[Extension]:
    exts = []
    for pyx in sorted(ROOT.glob("pyllama/**/*.pyx")):
        module = ".".join(pyx.relative_to(ROOT).with_suffix("").parts)
        exts.append(Extension(module, [str(pyx.relative_to(ROOT))], include_dirs=[np.get_include()]))
    for pyx in sorted(ROOT.glob("plugins/*.pyx")):
        exts.append(
            Extension(f"pyllama.plugins.{pyx.stem}", [str(pyx.relative_to(ROOT))], include_dirs=[np.get_include()])
        )
    return exts


directives = {
    "language_level": 3,
    "boundscheck": DEBUG_CHECKS,
    "wraparound": DEBUG_CHECKS,
    "initializedcheck": DEBUG_CHECKS,
    "cdivision": True,
    "nonecheck": False,
    "embedsignature": True,
}

setup(
    # the top-level plugins/ folder is the package pyllama.plugins (package-dir in pyproject.toml)
    packages=[*find_packages(include=["pyllama", "pyllama.*"]), "pyllama.plugins"],
    ext_modules=cythonize(
        _extensions(), compiler_directives=directives, include_path=[str(ROOT)], nthreads=os.cpu_count() or 1
    ),
    cmdclass={"build_ext": BuildExt},
)
