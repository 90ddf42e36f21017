"""From a checked study to its cells: models × probes × plugin grid points (× seeds) × budgets.

Planning happens on the client before any work is sent: every model is mapped (a missing or broken
file is refused here, naming the entry), every probe is tokenised, every spec is parsed, budgets are
sized by measurement (:mod:`pyllama.sweep.budget`). Each cell gets a key, a hash of what determines
its result — the model's and tokenizer's sha256, the canonical specs, the probe (a text probe by its
content's sha256), the seed and the budget — so ``--resume`` recognises a cell that is already in the
table even when the files have moved.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pyllama.attention.registry import create_plugin
from pyllama.diff.probes import PROBE_NAMES, RETRIEVAL_NAMES, Probe, is_probe_name, load_probe
from pyllama.errors import PyllamaError
from pyllama.hub import resolve
from pyllama.model import Model
from pyllama.sweep.budget import BudgetSizer
from pyllama.sweep.cell import Cell
from pyllama.sweep.study import GridPoint, Study

__all__ = ["Plan", "cell_key", "file_sha256", "plan_study"]

_SHA_CACHE: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SHA_CACHE:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _SHA_CACHE[key] = h.hexdigest()
    return _SHA_CACHE[key]


def cell_key(**fields) -> str:
    """16 hex digits of the sha256 of the fields, as sorted JSON."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class ModelEntry:
    path: str
    sha256: str
    tokenizer: str | None
    tokenizer_sha256: str | None
    model: Model  # mapped on the client for planning
    probes: dict[str, Probe] = field(default_factory=dict)


@dataclass
class Plan:
    study: Study
    reference: str
    cells: list[Cell]
    models: dict[str, ModelEntry]

    def probe_of(self, cell: Cell) -> Probe:
        return self.models[cell.model].probes[cell.probe]


def plan_study(study: Study, threads: int = 1) -> Plan:
    """Every cell of ``study``, checked; StudyError (one line naming the entry) on the first problem."""
    reference = study.check_reference()
    points = study.grid_points()
    models = {}
    for i, name in enumerate(study.models):
        entry = _load_model(study, i, name)
        models[entry.path] = entry
    probe_ids = _load_probes(study, models)
    ref_positions = _max_positions(reference)
    budgets: list[int | None] = [*study.budgets] or [None]  # None: the grid point as written
    cells: list[Cell] = []
    for entry in models.values():
        for source, probe in entry.probes.items():
            longest = max(probe.segments, key=len).tokens
            sizer = BudgetSizer(entry.model, longest, ref_positions or entry.model.config.seq_len, threads)
            for point in points:
                for budget in budgets:
                    cells.append(_cell(study, entry, reference, point, source, probe_ids[source], budget, sizer))
    return Plan(study, reference, _unique(cells), models)


def _load_probes(study: Study, models: dict[str, ModelEntry]) -> dict[str, str]:
    """Tokenise every probe for every model; ``{source: what identifies it in a cell key}``."""
    probe_ids = {}
    for i, probe in enumerate(study.probes):
        named = is_probe_name(probe) and not Path(study.path(probe)).is_file()
        source = probe if named else study.path(probe)
        if not named and not Path(source).is_file():
            names = ", ".join(PROBE_NAMES + RETRIEVAL_NAMES)
            raise study.fail(f"probes[{i}]", f"{probe!r} is neither a probe name ({names}) nor a file")
        # a named probe is generated from its spec (seeded), so the spec identifies it
        probe_ids[source] = probe if named else "text:" + file_sha256(source)
        for entry in models.values():
            try:
                entry.probes[source] = load_probe(source, entry.model.tokenizer, entry.model.config.seq_len)
            except PyllamaError as exc:
                raise study.fail(f"probes[{i}]", str(exc)) from None
    return probe_ids


def _cell(
    study: Study,
    entry: ModelEntry,
    reference: str,
    point: GridPoint,
    source: str,
    probe_id: str,
    budget: int | None,
    sizer: BudgetSizer,
) -> Cell:
    """One cell: the grid point on this model and probe, sized to ``budget`` if there is one."""
    spec, knobs = point.spec, point.knobs
    if budget is not None and point.size_by is not None:
        where = f"{study.source}: plugins[{point.entry}] ({point.family}), budget {budget}"
        spec, values, _ = sizer.size(point.spec, point.size_by, budget, where)
        knobs = tuple((k, values[k]) for k, _ in point.knobs)
    seed = dict(knobs).get("seed") if study.seeds else None
    key = cell_key(
        model=entry.sha256,
        tokenizer=entry.tokenizer_sha256,
        reference=reference,
        spec=_portable(spec),
        probe=probe_id,
        seed=seed,
        budget=budget,
    )
    return Cell(
        key=key,
        model=entry.path,
        model_sha256=entry.sha256,
        tokenizer=entry.tokenizer,
        reference=reference,
        family=point.family,
        spec=spec,
        knobs=knobs,
        probe=source,
        seed=seed,
        budget=budget,
        entry=point.entry,
    )


def _load_model(study: Study, index: int, name: str) -> ModelEntry:
    where = f"models[{index}]"
    try:
        path = resolve(study.path(name))
    except PyllamaError as exc:
        raise study.fail(where, str(exc)) from None
    if not Path(path).is_file():
        raise study.fail(where, f"no such model file {name!r} (paths are relative to the study file)")
    tokenizer = None
    if study.tokenizer:
        try:
            tokenizer = str(resolve(study.path(study.tokenizer), kind="tokenizer"))
        except PyllamaError as exc:
            raise study.fail("tokenizer", str(exc)) from None
        if not Path(tokenizer).is_file():
            raise study.fail("tokenizer", f"no such tokenizer file {study.tokenizer!r}")
    try:
        model = Model.load(path, tokenizer=tokenizer, threads=1)
    except PyllamaError as exc:
        raise study.fail(where, str(exc)) from None
    if model.tokenizer is None:
        raise study.fail(where, f"{name}: no tokenizer found beside it; set tokenizer = ... in the study")
    resolved = str(path.resolve())
    tok = str(Path(tokenizer).resolve()) if tokenizer else None  # None: the model's own (its sha256 covers it)
    return ModelEntry(resolved, file_sha256(resolved), tok, file_sha256(tok) if tok else None, model)


def _max_positions(spec: str) -> int:
    """The positions a plugin holds as configured (0: the model's context)."""
    return int(create_plugin(spec).max_positions)


_FILE_SPEC = re.compile(r"^(?P<path>.+?\.pyx?):(?P<rest>[A-Za-z_][A-Za-z0-9_]*(?::.*)?)$")


def _portable(spec: str) -> str:
    """A file plugin's spec with the file's sha256 instead of its path, so the key survives a move
    and changes when the file does."""
    m = _FILE_SPEC.match(spec)
    if m is None or not Path(m.group("path")).is_file():
        return spec
    return f"file:{file_sha256(m.group('path'))}:{m.group('rest')}"


def _unique(cells: list[Cell]) -> list[Cell]:
    """Cells in study order, each key once (a setting written twice in the grid runs once)."""
    seen: set[str] = set()
    out = []
    for c in cells:
        if c.key not in seen:
            seen.add(c.key)
            out.append(c)
    return out
