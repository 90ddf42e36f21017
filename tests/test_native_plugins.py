"""Cython plugins in a local file (``file.pyx:Class``): compiled on first use, then fast and exact.

The template ``experiments/random_evict_native.pyx`` is checked the way every built-in is: equal to
``causal`` bit for bit when nothing is evicted, its memory ledger, and thread-count independence.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.attention.native import build_pyx
from pyllama.cli import main
from pyllama.errors import PluginError
from pyllama.model import Model

TEMPLATE = Path(__file__).resolve().parents[1] / "experiments" / "random_evict_native.pyx"
SPEC = f"{TEMPLATE}:RandomEvictNative"
TEXT = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with "
    "her dog. One day, she saw a big red ball under a tree and ran to get it."
)


@pytest.fixture(scope="module", autouse=True)
def plugin_cache(tmp_path_factory):
    # compile into a fresh cache folder, never the user's
    with pytest.MonkeyPatch.context() as mp:
        folder = tmp_path_factory.mktemp("pyllama-cache")
        mp.setenv("PYLLAMA_CACHE", str(folder))
        yield folder


@pytest.fixture(scope="module")
def model() -> Model:
    return Model.load(shared_file("stories260K.bin"), tokenizer=shared_file("tok512.bin"), threads=2)


def test_template_equals_causal_when_nothing_is_evicted(model):
    report = model.diff("causal", f"{SPEC}:budget=512", probe="stories", progress=False)
    assert report.n_positions > 2000
    assert report.exact and float(report.max_abs_dlogit.max()) == 0.0


def test_template_evicts_after_budget_with_flat_memory(model):
    report = model.diff("causal", f"{SPEC}:budget=16,seed=3", text=TEXT, progress=False)
    assert report.summary["first_diff"]["position"] == 16  # exact while every position fits
    assert np.all(report.max_abs_dlogit[report.position < 16] == 0)
    cfg = model.config
    per_position = 2 * cfg.n_layers * cfg.kv_dim * 4
    assert list(report.mem_b[:20]) == [per_position * min(p + 1, 16) for p in range(20)]


def test_template_same_logits_for_any_thread_count_and_after_reset(model):
    ids = model.tokenize(TEXT)
    runs = []
    for threads in (1, 2, 3, 2):
        engine = model.engine(f"{SPEC}:budget=8", threads=threads)
        engine.reset()
        runs.append(np.stack([engine.forward(t, p).copy() for p, t in enumerate(ids)]))
    for r in runs[1:]:
        assert np.array_equal(runs[0], r)


def test_second_load_uses_the_cache(plugin_cache):
    first = build_pyx(TEMPLATE, "template")
    stamp = first.stat().st_mtime_ns
    assert build_pyx(TEMPLATE, "template") == first and first.stat().st_mtime_ns == stamp
    assert first.is_relative_to(plugin_cache)


def test_a_change_to_pyllamas_declarations_builds_again(monkeypatch):
    # a module built against an older GatherAttention layout must never be loaded
    from pyllama.attention import native

    first = build_pyx(TEMPLATE, "template")
    monkeypatch.setattr(native, "_declarations", lambda: b"cdef class GatherAttention: pass  # changed")
    second = build_pyx(TEMPLATE, "template")
    assert second != first and second.is_file()


def test_compile_error_is_one_line_naming_the_file_and_line(tmp_path):
    bad = tmp_path / "broken.pyx"
    bad.write_text(
        "from pyllama.attention.gather cimport GatherAttention\n"
        "cdef class Broken(GatherAttention):\n"
        "    description = 'broken'\n"
        "    cdef int attend_c(self, int layer, long long pos, float* q, float* k, float* v, float* out) "
        "except -1 nogil:\n"
        "        return undefined_name\n"
    )
    with pytest.raises(PluginError, match=r"compiling broken\.pyx failed: .*broken.*\.pyx:5"):
        build_pyx(bad, "broken.pyx:Broken")
    model_args = ["-c", str(shared_file("stories260K.bin")), "-z", str(shared_file("tok512.bin"))]
    result = CliRunner().invoke(main, ["generate", *model_args, "--attention", f"{bad}:Broken", "-n", "4"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    # the build's progress line, then the error's one line
    assert lines[:-1] == ["compiling broken.pyx (first use; later runs load the cached build)..."], result.stderr
    assert lines[-1].startswith("error: ") and "compiling broken.pyx failed" in lines[-1], result.stderr


def test_missing_class_in_a_compiled_file_is_named(model):
    with pytest.raises(PluginError, match="has no class 'Nope'; it defines RandomEvictNative"):
        model.engine(f"{TEMPLATE}:Nope")
