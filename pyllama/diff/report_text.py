"""The terminal rendering of a DiffReport: what ``DiffReport.table()`` returns and the CLI prints.

A header, one line per sequence, the summary (exactness verdict, KL, agreement, first difference,
first non-finite value, perplexity, memory, per-layer error), then the recall, retrieval and RULER
sections when the probe has them. Numbers are shortened by ``sig3`` (three significant digits, 0 as "0").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from pyllama.diff.metrics import perplexity

if TYPE_CHECKING:
    from pyllama.diff.report import DiffReport
    from pyllama.diff.retrieval_scores import RetrievalRow


def report_table(report: DiffReport) -> str:
    """The whole terminal report of ``report``."""
    out = [
        f"diff {report.a} (A) vs {report.b} (B) on {report.model}, probe {report.probe}: "
        f"{len(report.segments)} sequence{'' if len(report.segments) == 1 else 's'}, "
        f"{report.n_positions:,} positions, {report.seconds:.2f} s"
        + "".join(f"; {side} replayed from its recorded run" for side in report.replayed)
    ]
    out += [f"note: {n}" for n in report.notes]
    if report.n_positions == 0:
        return "\n".join(out)
    out += ["", *sequence_lines(report), "", *summary_lines(report.summary)]
    if report.recall:
        out += ["", *recall_lines(report)]
    keys = [r for r in report.retrieval if r.kind != "ruler"]
    if keys:
        out += ["", *retrieval_table(keys, report.summary)]
    ruler = [r for r in report.retrieval if r.kind == "ruler"]
    if ruler:
        out += ["", *ruler_table(ruler, report.summary)]
    return "\n".join(out)


def sequence_lines(report: DiffReport) -> list[str]:
    """A column header and one line per sequence of the probe (its metrics and memory at its end)."""
    w = max([14, *(len(seg.name) + 1 for seg in report.segments)])  # a long name keeps its columns apart
    head = (
        f"{'sequence':<{w}}{'positions':>10}{'max|Δlogit|':>13}{'mean KL':>10}{'max KL':>10}"
        f"{'top-1':>8}{'ppl A':>9}{'ppl B':>9}{'bytes A':>12}{'bytes B':>12}"
    )
    out = [head, "-" * len(head)]
    for i, seg in enumerate(report.segments):
        rows = report.segment == i
        if not rows.any():
            out.append(f"{seg.name:<{w}}{0:>10}  (not compared)")
            continue
        last = np.nonzero(rows)[0][-1]
        out.append(
            f"{seg.name:<{w}}{int(rows.sum()):>10}{sig3(report.max_abs_dlogit[rows].max()):>13}"
            f"{sig3(report.kl[rows].mean()):>10}{sig3(report.kl[rows].max()):>10}"
            f"{100 * report.agree[rows].mean():>7.1f}%{perplexity(report.logp_a[rows]):>9.3f}"
            f"{perplexity(report.logp_b[rows]):>9.3f}{int(report.mem_a[last]):>12,}{int(report.mem_b[last]):>12,}"
        )
    return out


def summary_lines(s: dict) -> list[str]:
    """The summary block, from ``DiffReport.summary``."""
    verdict = "EXACT: every logit bit-identical" if s["exact"] else "differs"
    out = [
        f"max |Δlogit|        {sig3(s['max_abs_dlogit'])}   ({verdict})",
        f"KL(A‖B) nats        mean {sig3(s['mean_kl'])}, p99 {sig3(s['p99_kl'])}, max {sig3(s['max_kl'])}",
        f"top-1 agreement     {100 * s['top1_agreement']:.2f}%",
    ]
    fd = s["first_diff"]
    out.append("first difference    " + (f"position {fd['position']} ({fd['sequence']})" if fd else "none"))
    nf = s["first_nonfinite"]
    if nf is not None:
        where = f"layer {nf['layer']}" if nf["layer"] is not None else "the logits"
        out.append(
            f"first non-finite    position {nf['position']} ({nf['sequence']}), side {nf['side']}, {where}: "
            "NaN or Inf, counted as a difference"
        )
    out.append(f"perplexity          A {s['ppl_a']:.4f}, B {s['ppl_b']:.4f}, B/A {s['ppl_ratio']:.4f}")
    out.append(
        f"memory at the end   ({s['last']['sequence']}, position {s['last']['position']}) "
        f"A {s['bytes_last_a']:,} B ({s['bytes_ratio_a']:.3g}x causal), "
        f"B {s['bytes_last_b']:,} B ({s['bytes_ratio_b']:.3g}x causal)"
    )
    errs = ", ".join(f"L{i} {sig3(v)}" for i, v in enumerate(s["layer_err_mean"]))
    first_layer = s["first_diff_layer"]
    out.append(
        f"attention out err   mean rel. L2 by layer: {errs}"
        + (f"; first differing layer {first_layer}" if first_layer is not None else "")
    )
    return out


def recall_lines(report: DiffReport) -> list[str]:
    """P(name) under each side at every recurrence of a name (the first mention is not scored)."""
    out = [
        "recall: P(name) at each mention (distance = tokens since the previous mention)",
        f"{'sequence':<14}{'name':<8}{'position':>9}{'distance':>9}{'P A':>11}{'P B':>11}",
    ]
    for r in report.recall:
        if r.mention == 0:
            continue
        out.append(f"{r.segment:<14}{r.name:<8}{r.position:>9}{r.distance:>9}{sig3(r.p_a):>11}{sig3(r.p_b):>11}")
    return out


def retrieval_table(rows: list[RetrievalRow], s: dict) -> list[str]:
    """The retrieval section of ``table()``: per sequence, each side's P(key), worst key-token rank,
    greedy answer and verdict (retrieves = every key token rank 1 and the greedy answer holds the key)."""
    out = [
        "retrieval: P(key) teacher-forced, the worst rank of its tokens, the greedy answer; "
        "retrieves = all ranks 1 and the answer holds the key",
        f"{'sequence':<22}{'key':>8}{'distance':>9}{'P A':>10}{'rank A':>8}{'greedy A':>10}"
        f"{'P B':>10}{'rank B':>8}{'greedy B':>10}  retrieves A/B",
    ]
    for r in rows:
        cells = []
        a, b = r.both()
        for sc in (a, b):
            greedy = "-" if sc.greedy is None else repr(sc.greedy.strip())[:9]
            cells.append(f"{sig3(sc.p):>10}{sc.max_rank:>8}{greedy:>10}")
        if r.kind == "copy":
            verdict = f"loss A {a.loss:.3f}, B {b.loss:.3f} nats/token"
        else:
            verdict = f"{'yes' if a.retrieves else 'no'}/{'yes' if b.retrieves else 'no'}"
        key = r.key if r.kind == "passkey" else "(span)"
        out.append(f"{r.segment:<22}{key:>8}{r.distance:>9}{''.join(cells)}  {verdict}")
    for side in "ab":
        if f"retrieval_{side}" in s:
            match = s.get(f"greedy_match_{side}")
            out.append(
                f"{side.upper()}: retrieves {100 * s[f'retrieval_{side}']:.0f}% of the keys, mean log P(key) "
                f"{s[f'key_logp_{side}']:.3g}" + ("" if match is None else f", greedy holds the key {100 * match:.0f}%")
            )
        if f"copy_loss_{side}" in s:
            out.append(
                f"{side.upper()}: loss on the second copy {s[f'copy_loss_{side}']:.4f} nats/token, "
                f"rank 1 at {100 * s[f'copy_rank1_{side}']:.0f}% of its tokens"
            )
    return out


def ruler_table(rows: list[RetrievalRow], s: dict) -> list[str]:
    """The RULER section of ``table()``: per sequence and side, log P(answer) teacher-forced, the
    worst rank of its tokens, RULER's string_match_all of the greedy answer, and that answer."""
    w = max([22, *(len(r.segment) + 1 for r in rows)])
    out = [
        "ruler: log P(answer) teacher-forced, the worst rank of its tokens, string_match_all of the greedy "
        "answer (the share of the references it holds)",
        f"{'sequence':<{w}}{'answer':<24}{'logP A':>9}{'rank A':>8}{'all A':>7}{'logP B':>9}{'rank B':>8}"
        f"{'all B':>7}  greedy A | greedy B",
    ]
    for r in rows:
        cells, greedy = [], []
        for sc in r.both():
            match = "-" if sc.match_all is None else f"{sc.match_all:.2f}"
            cells.append(f"{sig3(sc.logp):>9}{sc.max_rank:>8}{match:>7}")
            greedy.append("-" if sc.greedy is None else repr(sc.greedy[:24]))
        out.append(f"{r.segment:<{w}}{repr(r.key[:22]):<24}{''.join(cells)}  {' | '.join(greedy)}")
    for side in "ab":
        score, part = s.get(f"ruler_score_{side}"), s.get(f"ruler_part_{side}")
        scored = "greedy answers not decoded" if score is None else f"score {score:.2f} (part {part:.2f})"
        out.append(
            f"{side.upper()}: RULER string_match_all {scored}, mean log P(answer) {s[f'ruler_logp_{side}']:.3g}, "
            f"every answer token rank 1 in {100 * s[f'ruler_rank1_{side}']:.0f}% of the sequences"
        )
    return out


def sig3(x: float) -> str:
    """``x`` in three significant digits (0 as "0"): how the report prints its numbers."""
    x = float(x)
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"
