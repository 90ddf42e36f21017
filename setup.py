"""Build the Cython extensions: every .pyx under pyllama/ and plugins/ (packaged as pyllama.plugins).

The compiler flags, Cython directives and environment switches (PYLLAMA_PORTABLE,
PYLLAMA_BOUNDSCHECK, PYLLAMA_NO_OPENMP) live in pyllama/build_config.py, which the compiler of
.pyx plugins (pyllama/attention/native.py) uses too.
"""

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent


def _load_build_config():
    """pyllama/build_config.py by path: the package itself is not built yet."""
    spec = importlib.util.spec_from_file_location("pyllama_build_config", ROOT / "pyllama" / "build_config.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


build_config = _load_build_config()


class BuildExt(build_ext):
    """Applies build_config's flags for this compiler: optimisation, -march=native, OpenMP or a warned serial build."""

    def build_extensions(self):
        cc = self.compiler.compiler_so if hasattr(self.compiler, "compiler_so") else ["cc"]
        cfg = build_config.build_config(cc)
        if not cfg.openmp:
            print(
                f"WARNING: pyllama is being built WITHOUT OpenMP ({cfg.no_openmp_reason}): kernels run on one "
                "thread and --threads has no effect.",
                file=sys.stderr,
            )
        for ext in self.extensions:
            ext.extra_compile_args = list(ext.extra_compile_args or []) + cfg.compile_args
            ext.extra_link_args = list(ext.extra_link_args or []) + cfg.link_args
        super().build_extensions()


def _extensions() -> list[Extension]:
    # the C headers that kernel modules include (C's own #include is not followed by cythonize):
    # an edited header recompiles the modules beside it
    headers = [str(h.relative_to(ROOT)) for h in sorted(ROOT.glob("pyllama/**/*.h"))]
    exts = []
    for pyx in sorted(ROOT.glob("pyllama/**/*.pyx")):
        module = ".".join(pyx.relative_to(ROOT).with_suffix("").parts)
        near = [h for h in headers if Path(h).parent == pyx.relative_to(ROOT).parent]
        exts.append(Extension(module, [str(pyx.relative_to(ROOT))], include_dirs=[np.get_include()], depends=near))
    for pyx in sorted(ROOT.glob("plugins/*.pyx")):
        exts.append(
            Extension(f"pyllama.plugins.{pyx.stem}", [str(pyx.relative_to(ROOT))], include_dirs=[np.get_include()])
        )
    return exts


setup(
    # the top-level plugins/ folder is the package pyllama.plugins (package-dir in pyproject.toml)
    packages=[*find_packages(include=["pyllama", "pyllama.*"]), "pyllama.plugins"],
    ext_modules=cythonize(
        _extensions(),
        compiler_directives=build_config.cython_directives(),
        include_path=[str(ROOT)],
        nthreads=os.cpu_count() or 1,
    ),
    cmdclass={"build_ext": BuildExt},
)
