"""The diff harness: teacher-force one token sequence through two attention plugins that share
one set of weights, and report per position how far they drift apart and what memory each holds.

    from pyllama.model import Model
    m = Model.load("stories260K.bin", tokenizer="tok512.bin")
    report = m.diff("causal", "sliding:64", probe="standard")
    report.summary, report.to_pandas(), report.plot()
"""

from pyllama.diff.harness import run_diff
from pyllama.diff.probes import Probe, Segment, load_probe
from pyllama.diff.report import DiffReport

__all__ = ["DiffReport", "Probe", "Segment", "load_probe", "run_diff"]
