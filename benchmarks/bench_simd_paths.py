"""The quantised row products on each SIMD path this machine can build, side by side in one run.

The build's own path (AVX-512 VNNI, AVX-512, AVX2 or portable) is timed against the other paths
compiled beside it, the way tests/test_simd_paths.py builds them (switched-off instruction sets, or
SIMDe's emulation, which is too slow to time and is left out). Each path runs in its own process on
the same random blocks: microseconds per product of one matrix (default 2048 x 768, the shape of a
stories110M feed-forward matrix) with a float32 vector at one thread, best of the repeats.

    python benchmarks/bench_simd_paths.py --types Q4_K,Q6_K,Q4_0 --paths avx2,portable
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import test_simd_paths as paths  # noqa: E402  (the build recipes live with their test)

TIMER = """
import json, sys, time
import gguf, numpy as np
from quant_reference import random_blocks
from pyllama.checkpoint.weights import QType, Tensor
from pyllama.kernels.matvec import matvec_tensor
from pyllama.kernels.qproduct import simd_path
types, rows, cols, repeats = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
out = {"path": simd_path()}
for name in types:
    rng = np.random.default_rng(0)
    raw = np.ascontiguousarray(random_blocks(rng, gguf.GGMLQuantizationType[name], rows, cols))
    w, x = Tensor("w", QType[name], rows, cols, raw), rng.standard_normal(cols).astype(np.float32)
    for _ in range(20):
        matvec_tensor(w, x, 1)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(200):
            matvec_tensor(w, x, 1)
        best = min(best, (time.perf_counter() - t0) / 200)
    out[name] = best * 1e6
print(json.dumps(out))
"""


def _build(path: str, root: Path) -> Path | str:
    """A copy of the package whose kernel modules take ``path``, or why it cannot be built here."""
    recipe = paths.recipe(path)
    if isinstance(recipe, str):
        return recipe
    env_switches, extra = recipe
    if env_switches.get("PYLLAMA_EMULATE_AVX512"):
        return "emulated (SIMDe): too slow to be worth timing"
    copy = root / path / "pyllama"
    shutil.copytree(paths.PACKAGE, copy, ignore=shutil.ignore_patterns("*.c", "__pycache__"), symlinks=True)
    with ThreadPoolExecutor(max_workers=len(paths.MODULES)) as pool:
        list(pool.map(lambda m: paths.compile_module(m, env_switches, extra, copy / "kernels"), paths.MODULES))
    return copy.parent


def _time(where: Path | None, args: argparse.Namespace) -> dict:
    # the copy first (and as the working directory), then the tests' quant_reference
    search = [str(where)] if where else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*search, str(REPO / "tests")])}
    argv = [sys.executable, "-c", TIMER, args.types, str(args.rows), str(args.cols), str(args.repeats)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=where or REPO, check=True)
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", default="Q4_0,Q4_1,Q5_0,Q8_0,IQ4_NL,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K")
    parser.add_argument("--paths", default="avx512,avx2,portable", help="the other paths to build and time")
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--passes", type=int, default=2, help="alternating passes over all paths")
    args = parser.parse_args()
    types = args.types.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        builds: dict[str, Path | None] = {"this build": None}
        for path in args.paths.split(","):
            built = _build(path, Path(tmp))
            if isinstance(built, str):
                print(f"{path}: not timed ({built})")
            else:
                builds[path] = built
        rows: dict[str, list[dict]] = {name: [] for name in builds}
        for _ in range(args.passes):
            for name, where in builds.items():
                rows[name].append(_time(where, args))
    own = rows["this build"]
    print(f"\nmicroseconds per {args.rows} x {args.cols} product, 1 thread, best of {args.repeats}; per pass\n")
    print("| path | " + " | ".join(types) + " |")
    print("| --- |" + " ---: |" * len(types))
    for name, runs in rows.items():
        cells = [" / ".join(f"{r[t]:.1f}" for r in runs) for t in types]
        print(f"| {runs[0]['path']}{' (this build)' if name == 'this build' else ''} | " + " | ".join(cells) + " |")
    print("\nthe path's time / this build's, same pass (above 1: this build is faster)\n")
    for name, runs in rows.items():
        if name != "this build":
            ratios = [" / ".join(f"{r[t] / o[t]:.2f}" for r, o in zip(runs, own, strict=True)) for t in types]
            print(f"| {runs[0]['path']} | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
