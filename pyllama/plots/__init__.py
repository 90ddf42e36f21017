"""Figures of a diff report (matplotlib). One function per figure, each returning the Figure.

The x axis is the position in a sequence; a probe has several sequences, so each curve shows, per
position, the worst (max |Δlogit|) or the mean (KL, layer error) over the sequences that reach it.
Colours are the Okabe-Ito palette and the heatmap uses cividis, both readable with colour-vision
deficiencies. Figures are built without pyplot (no GUI backend needed); in a notebook a returned
Figure displays itself once the inline backend is on (``%matplotlib inline``).

One report (plugin B against plugin A): ``divergence_figure``, ``layer_error_figure``,
``memory_figure``, ``recall_figure`` and ``report_figure`` (the overview ``pyllama diff --plot``
writes). Several reports against one reference, one line or point per plugin:
``compare_divergence_figure``, ``compare_memory_figure`` and ``pareto_figure`` (memory against mean
KL); ``study_pareto_figure`` draws the same from a sweep's results table, a front per plugin family.
``nll_figure`` draws per-position negative log-likelihoods of several plugins.
``held_positions_figure`` draws which positions each plugin holds as a sequence goes on (from
``held_positions_record``: one layer and KV head, a panel per plugin).

    fig = divergence_figure(report); fig.savefig("divergence.png")
    fig = pareto_figure([m.diff("causal", spec) for spec in ("sliding:64", "sink:4,60", "lattice")])
"""

from pyllama.plots.compare import (
    compare_divergence_figure,
    compare_memory_figure,
    nll_figure,
    pareto_figure,
    pareto_front,
    study_pareto_figure,
)
from pyllama.plots.held import HeldRecord, held_positions_figure, held_positions_record
from pyllama.plots.report import (
    divergence_figure,
    layer_error_figure,
    memory_figure,
    recall_figure,
    report_figure,
)
from pyllama.plots.retrieval import key_distance_figure, needle_heatmap_figure
from pyllama.plots.style import OKABE_ITO

__all__ = [
    "OKABE_ITO",
    "HeldRecord",
    "compare_divergence_figure",
    "compare_memory_figure",
    "divergence_figure",
    "held_positions_figure",
    "held_positions_record",
    "key_distance_figure",
    "layer_error_figure",
    "memory_figure",
    "needle_heatmap_figure",
    "nll_figure",
    "pareto_figure",
    "pareto_front",
    "recall_figure",
    "report_figure",
    "study_pareto_figure",
]
