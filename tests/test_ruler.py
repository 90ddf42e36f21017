"""RULER's synthetic tasks as probes (pyllama.diff.probes.ruler): each generated sample checked
against RULER's own structure, written out here from RULER's ``scripts/data/synthetic/constants.py``
and generators (NVIDIA/RULER), its length in the model's tokens, its seeding, RULER's two string
match scores on hand-made cases, and a diff on SmolLM2 that scores one task end to end.

The structure checks read the sample back from its *tokens* (decoded by the tokenizer), not from
the generator's own text, and recompute every answer from the haystack: the values of the queried
keys' needles, the chain's variables, the most common and most frequent words.
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import shared_file

from pyllama.cli import main
from pyllama.diff.probes import load_probe
from pyllama.diff.probes.ruler import TASK_NAMES, ruler_sample
from pyllama.diff.probes.ruler_metrics import postprocess, string_match_all, string_match_part
from pyllama.errors import InputError
from pyllama.model import Model

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"

# RULER's text, typed from its constants.py and niah.py (the niah template before its singular edits)
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
NIAH_PLURAL = (
    r"Some special magic {v} are hidden within the following text\. Make sure to memorize it\. "
    r"I will quiz you about the {v} afterwards\.\n(?P<context>.*)\n"
    r"What are all the special magic {v} for (?P<query>.+) mentioned in the provided text\?"
)
NIAH_SINGULAR = (
    r"A special magic {v} is hidden within the following text\. Make sure to memorize it\. "
    r"I will quiz you about the {v} afterwards\.\n(?P<context>.*)\n"
    r"What is the special magic {v} for (?P<query>.+) mentioned in the provided text\?"
)
VT_TASK = (
    r"Memorize and track the chain\(s\) of variable assignment hidden in the following text\.\n\n"
    r"(?P<{c}>.*)\nQuestion: Find all variables that are assigned the value (?P<{q}>\d{{5}}) in the text above\."
)
VT_PREFIX = r"Answer: According to the chain\(s\) of variable assignment in the text above, 5 variables are assigned the value {v}, they are:"  # noqa: E501
CWE_TASK = (
    r"Below is a numbered list of words\. In these words, some appear more often than others\. Memorize the "
    r"ones that appear most often\.\n(?P<{c}>.*)\nQuestion: What are the 10 most common words in the above list\?"
)
CWE_PREFIX = r"Answer: The top 10 words that appear most often in the list are:"
FWE_TASK = (
    r"Read the following coded text and track the frequency of each coded word\. Find the three most "
    r"frequently appeared coded words\. (?P<context>.*)\nQuestion: Do not provide any explanation\. Please ignore "
    r"the dots '\.\.\.\.'\. What are the three most frequently appeared words in the above coded text\?"
)
FWE_PREFIX = r"Answer: According to the coded text above, the three most frequently appeared words are:"
# RULER's synthetic.yaml: haystack, key and value kinds, needle counts (keys, values, queries)
NIAH = {
    "niah_single_1": ("noise", "words", "numbers", 1, 1, 1),
    "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": ("essay", "words", "numbers", 4, 1, 4),
}


@pytest.fixture(scope="module")
def smollm2():
    return Model.load(shared_file(SMOLLM2), threads=1)


@pytest.fixture(scope="module")
def stories(stories260k, tok512):
    return Model.load(stories260k, tokenizer=tok512, threads=1)


def _reply(tokenizer, sample, chat: bool) -> tuple[str, str]:
    """(the user's text, the reply) as the tokens spell them: decoded by the tokenizer, the chat
    template's control tokens printing nothing (so "user\\n" and "assistant\\n" mark the turns)."""
    ids = sample.tokens.tolist()
    text = tokenizer.decode([ids[0], *ids]) if chat else tokenizer.decode(ids)
    if chat:
        user, _, reply = text.rpartition("\nassistant\n")
        return user.rpartition("\nuser\n")[2], reply
    return text, ""


def _split_prefix(user: str, reply: str, chat: bool, prefix: str) -> tuple[str, str]:
    """(the user's text, the answer after RULER's answer prefix): in chat the prefix starts the
    reply, in plain text it follows the question after a space."""
    body = reply if chat else user
    m = re.fullmatch("(?P<user>.*)" + ("" if chat else " ") + prefix + "(?P<answer> [^\n]*)", body, re.S)
    assert m is not None, f"no answer prefix {prefix!r} in {body[-300:]!r}"
    return (user if chat else m.group("user")), m.group("answer")


# ---- the needle tasks ----------------------------------------------------------------------------
def _needles(context: str, kind: str) -> list[tuple[str, str]]:
    value = r"\d{7}" if kind == "numbers" else UUID
    return re.findall(rf"One of the special magic {kind} for (.+?) is: ({value})\.", context)


def _check_niah(task: str, user: str, answer: str, sample) -> None:
    from pyllama.diff.probes.ruler_tasks import wonderwords_lists
    from pyllama.diff.probes.ruler_text import essay_words

    haystack, key_kind, value_kind, n_keys, n_values, n_queries = NIAH[task]
    single = n_values * n_queries == 1
    v = value_kind[:-1] if single else value_kind
    m = re.fullmatch((NIAH_SINGULAR if single else NIAH_PLURAL).format(v=v), user, re.S)
    assert m is not None, user[:300]
    context, query = m.group("context"), m.group("query")
    queries = re.split(r", and |, ", query) if n_queries > 1 else [query]
    needles = _needles(context, value_kind)
    by_query = [[val for k, val in needles if k == q] for q in queries]  # each queried key's needles
    assert all(len(values) == n_values for values in by_query)
    if n_values == 1:  # RULER's answer list: the queried keys' values, in the question's order
        assert list(sample.target.answers) == [values[0] for values in by_query]
    else:  # one key's values (RULER lists them as drawn, which the text does not show)
        assert sorted(sample.target.answers) == sorted(by_query[0])
    assert answer == " " + ", ".join(sample.target.answers)
    lists = wonderwords_lists()
    for key, _ in needles:
        if key_kind == "uuids":
            assert re.fullmatch(UUID, key)
        else:  # an adjective-noun pair of wonderwords' lists (either may hold a hyphen itself)
            cuts = [i for i, c in enumerate(key) if c == "-"]
            assert any(key[:i] in lists["adjective"] and key[i + 1 :] in lists["noun"] for i in cuts), key
    lines = context.split("\n")
    if haystack == "noise":
        assert len(needles) == n_keys * n_values
        rest = [line for line in lines if not line.startswith("One of the special magic")]
        assert rest and all(line == NOISE for line in rest[:-1]) and NOISE.startswith(rest[-1])
    elif haystack == "needle":  # every line a needle (the last may be cut), the queried key once
        assert all(re.fullmatch(rf"One of the special magic {value_kind} for .+ is: .+\.", x) for x in lines[:-1])
        head = f"One of the special magic {value_kind} for "
        assert lines[-1].startswith(head[: len(lines[-1])])
        assert len(needles) >= 5 and [k for k, _ in needles].count(queries[0]) == 1
    else:  # the essay from its start, the needles between its sentences
        assert len(needles) == n_keys * n_values
        text = re.sub(r" ?One of the special magic \w+ for .+? is: [\w-]+\.", "", context)
        words, essay = text.split(), list(essay_words())
        assert words == (essay * (1 + len(words) // len(essay)))[: len(words)] and len(words) > 50  # repeated


# ---- variable tracking, common and frequent words ----------------------------------------------
def _holders(context: str, value: str) -> list[str]:
    """Every variable the assignments give ``value``, in the order they receive it."""
    held: list[str] = []
    for line in context.split("\n"):
        m = re.fullmatch(r"VAR ([A-Z]+) = (?:(\d+)|VAR ([A-Z]+) )", line)
        if m and (m.group(2) == value or m.group(3) in held):
            held.append(m.group(1))
    return held


def _check_vt(user: str, answer: str, sample) -> None:
    example = VT_TASK.format(c="ex", q="ex_v") + " " + VT_PREFIX.format(v="(?P=ex_v)") + r" (?P<names>[A-Z ]+)\n"
    m = re.fullmatch(example + VT_TASK.format(c="context", q="value"), user, re.S)
    assert m is not None, user[:400]
    assert m.group("names").split() == _holders(m.group("ex"), m.group("ex_v"))
    assert all(len(n) == 3 for n in m.group("names").split())
    names = _holders(m.group("context"), m.group("value"))
    assert len(names) == 5 and all(len(n) == 5 for n in names)
    assert list(sample.target.answers) == names and answer == " " + " ".join(names)
    rest = [x for x in m.group("context").split("\n") if not x.startswith("VAR ")]
    assert all(x == NOISE for x in rest[:-1]) and NOISE.startswith(rest[-1])


def _numbered(listing: str) -> list[str]:
    items = re.split(r"(?:^| )(\d+)\. ", listing)[1:]
    numbers, words = items[0::2], items[1::2]
    assert numbers == [str(i + 1) for i in range(len(numbers))]
    return words


def _check_cwe(user: str, answer: str, sample, length: int, chat: bool) -> None:
    task = CWE_TASK.format(c="context")
    if chat:  # the worked example is an earlier turn: the user's text is the task alone
        m = re.fullmatch(task, user, re.S)
    else:
        m = re.fullmatch(CWE_TASK.format(c="ex") + " " + CWE_PREFIX + r" (?P<ex_answer>.*?)\n" + task, user, re.S)
    assert m is not None, user[:400]
    counts = Counter(_numbered(m.group("context")))
    common = [w for w, c in counts.items() if c == (30 if length >= 4096 else 6)]
    assert len(common) == 10
    assert all(c == (3 if length >= 4096 else 1) for w, c in counts.items() if w not in common)
    assert sorted(sample.target.answers) == sorted(common)
    assert _numbered(answer.strip()) == list(sample.target.answers)
    if not chat:
        example = Counter(_numbered(m.group("ex")))
        assert sorted(_numbered(m.group("ex_answer"))) == sorted(w for w, _ in example.most_common(10))


def _check_fwe(user: str, answer: str, sample, length: int) -> None:
    m = re.fullmatch(FWE_TASK, user, re.S)
    assert m is not None, user[:400]
    counts = Counter(m.group("context").split(" ")).most_common()
    assert counts[0][0] == "..."
    assert [w for w, _ in counts[1:4]] == list(sample.target.answers)
    assert counts[3][1] > (counts[4][1] if len(counts) > 4 else 0)  # no tie at the answer's edge
    assert all(re.fullmatch("[a-z]{6}", w) for w, _ in counts[1:])
    assert len(counts) <= (length - 50) // 50  # RULER's vocabulary size
    assert answer == " " + ", ".join(sample.target.answers)


def _check(model, task: str, length: int, chat: bool, seed: int = 0):
    sample = ruler_sample(model.tokenizer, task, length, seed, chat)
    user, reply = _reply(model.tokenizer, sample, chat)
    family = task if task in ("vt", "cwe", "fwe") else "niah"
    if family == "niah":
        _, _, kind, _, n_values, n_queries = NIAH[task]
        single = n_values * n_queries == 1
        prefix = rf"The special magic {kind[:-1] if single else kind} for .+ mentioned in the provided text " + (
            "is" if single else "are"
        )
    else:
        prefix = {"vt": VT_PREFIX.format(v=r"\d{5}"), "cwe": CWE_PREFIX, "fwe": FWE_PREFIX}[family]
    user, answer = _split_prefix(user, reply, chat, prefix)
    if family == "niah":
        _check_niah(task, user, answer, sample)
    elif family == "vt":
        _check_vt(user, answer, sample)
    elif family == "cwe":
        _check_cwe(user, answer, sample, length, chat)
    else:
        _check_fwe(user, answer, sample, length)
    _check_spans(model.tokenizer, sample, chat)
    return sample


def _check_spans(tokenizer, sample, chat: bool) -> None:
    """The answer ends the tokens; the question, the prefix and the first needle start where the
    target says."""
    t, ids = sample.target, sample.tokens.tolist()

    def text(a: int, b: int) -> str:
        return tokenizer.decode(ids[a - 1 : b])

    assert t.start + t.length == len(ids) and t.prompt == t.start
    assert text(t.start, len(ids)).strip() == sample.draft.answer_text.strip()
    assert text(t.context_end, t.prefix).startswith(("What", "Question"))  # the question's first token
    assert text(t.context_end - 1, t.context_end).endswith("\n")  # and the context's last one
    assert text(t.prefix, t.start).strip().startswith(("The special", "Answer:"))
    assert t.context_end < t.prefix < t.start
    assert text(t.needle, t.needle + 12).lstrip().startswith(t.answers[0][:3])
    assert t.kind == "ruler" and t.generate in (128, 30, 120, 50) and t.stop


# ---- the tests -----------------------------------------------------------------------------------
@pytest.mark.parametrize("task", TASK_NAMES)
def test_smollm2_tasks_have_rulers_structure(smollm2, task):
    """On SmolLM2 (chat template): RULER's template, answer prefix and answers, and the length
    within 1% of what was asked, in the model's tokens."""
    sample = _check(smollm2, task, 1024, chat=True)
    assert 0.99 * 1024 <= len(sample.tokens) <= 1024


@pytest.mark.parametrize("task", TASK_NAMES)
def test_stories260k_tasks_have_rulers_structure(stories, task):
    """On stories260K's 512-token vocabulary (no chat template): RULER's plain layout."""
    sample = _check(stories, task, 2048, chat=False)
    assert 0.99 * 2048 <= len(sample.tokens) <= 2048


# (model, length) -> tasks whose smallest sample is longer than that (cwe's list and worked example,
# vt's example on stories260K's vocabulary, which spells most words in several tokens)
TOO_SHORT = {("smollm2", 512): {"cwe"}, ("stories", 1024): {"cwe"}}


@pytest.mark.parametrize(
    "which,length",
    [("smollm2", 512), ("smollm2", 1024), ("smollm2", 1500), ("smollm2", 3000), ("stories", 1024), ("stories", 3000)],
)
def test_lengths_within_one_percent(smollm2, stories, which, length):
    model, chat = (smollm2, True) if which == "smollm2" else (stories, False)
    for task in TASK_NAMES:
        if task in TOO_SHORT.get((which, length), ()):
            with pytest.raises(InputError, match=rf"ruler {task}: .* more than length={length:,}"):
                ruler_sample(model.tokenizer, task, length, 1, chat)
            continue
        n = len(ruler_sample(model.tokenizer, task, length, 1, chat).tokens)
        assert 0.99 * length <= n <= length, (task, n)


@pytest.mark.parametrize("task", TASK_NAMES)
def test_smollm2_tasks_at_4096(smollm2, task):
    """From 4,096 tokens RULER's cwe repeats its words 30 and 3 times and vt's example is 500 tokens."""
    sample = _check(smollm2, task, 4096, chat=True)
    assert 0.99 * 4096 <= len(sample.tokens) <= 4096


@pytest.mark.ruler_long
@pytest.mark.parametrize("length", [8192, 16384])
def test_long_lengths(smollm2, length):
    for task in TASK_NAMES:
        sample = _check(smollm2, task, length, chat=True)
        assert 0.99 * length <= len(sample.tokens) <= length, task


@pytest.mark.parametrize("task", TASK_NAMES)
def test_same_seed_same_tokens_other_seed_other_tokens(smollm2, task):
    a = ruler_sample(smollm2.tokenizer, task, 1024, 3, True)
    b = ruler_sample(smollm2.tokenizer, task, 1024, 3, True)
    c = ruler_sample(smollm2.tokenizer, task, 1024, 4, True)
    assert np.array_equal(a.tokens, b.tokens) and a.target == b.target
    assert not np.array_equal(a.tokens, c.tokens) and a.target.answers != c.target.answers


def test_probe_spec(smollm2):
    tok, n = smollm2.tokenizer, smollm2.config.seq_len
    probe = load_probe("ruler:task=vt/fwe,length=600/700,seed=5,samples=2", tok, n)
    names = [s.name for s in probe.segments]
    assert names == [f"{t}-n{n}-s{s}" for t in ("vt", "fwe") for n in (600, 700) for s in (5, 6)]
    assert all(s.kind == "ruler" and s.target.task in s.name for s in probe.segments)
    every = load_probe("ruler:length=1024", tok, n)
    assert [s.target.task for s in every.segments] == list(TASK_NAMES)
    for bad, message in (
        ("ruler:task=niah_single_9", "unknown task"),
        ("ruler:length=10", "below 64"),
        ("ruler:depth=1", "ruler takes"),
        ("ruler:chat=maybe", "auto, yes or no"),
        ("ruler:seed=-1", "seed >= 0"),
    ):
        with pytest.raises(InputError, match=message):
            load_probe(bad, tok, n)


# ---- RULER's scores, by hand from its formula: round(sum(per sample) / len(preds) * 100, 2) --------
def test_string_match_all_and_part_by_hand():
    preds = ["The numbers are 123 and 456.", "nothing here"]
    refs = [["123", "456", "789"], ["abc"]]
    assert string_match_all(preds, refs) == 33.33  # (2/3 + 0) / 2 * 100 = 33.333...
    assert string_match_part(preds, refs) == 50.0  # (1 + 0) / 2 * 100
    # case is ignored on both sides
    assert string_match_all(["ABCDE fghij"], [["abcde", "FGHIJ"]]) == 100.0
    # one of three references in each of three predictions: 1/3 * 100, rounded
    assert string_match_all(["a", "b", "c"], [["a", "x", "y"], ["b", "x", "y"], ["c", "x", "y"]]) == 33.33
    assert string_match_part(["a", "b", "c"], [["a", "x", "y"], ["x", "y"], ["c"]]) == 66.67  # 2/3 * 100
    # a substring counts, as RULER's `in` does: "12" is in "123"
    assert string_match_all(["123"], [["12", "23", "4"]]) == 66.67
    assert postprocess("  \x01abc\x1f def\n ") == "abc\n def"


# ---- end to end: a diff on SmolLM2 ---------------------------------------------------------------
def _log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


def test_diff_scores_a_task_end_to_end(smollm2, tmp_path):
    """``pyllama diff causal sink:4,64 --probe ruler:...`` on SmolLM2: each side's log P(answer)
    and ranks as numpy computes them from ``Model.logits``, its greedy answer as ``Model.generate``
    writes it, and RULER's string_match_all of that answer."""
    spec = "ruler:task=niah_single_1,length=512"
    out = tmp_path / "r.json"
    args = ["diff", "causal", "sink:4,64", "--probe", spec, "-c", str(shared_file(SMOLLM2)), "--json", str(out)]
    result = CliRunner().invoke(main, [*args, "--csv", str(tmp_path / "r.csv")])
    assert result.exit_code == 0, result.output
    assert "RULER string_match_all" in result.output
    report = json.loads(out.read_text())
    (row,) = report["retrieval"]
    with open(tmp_path / "r.retrieval.csv", newline="") as f:  # the same row, per sequence, beside --csv
        (csv_row,) = list(csv.DictReader(f))
    assert csv_row["task"] == row["task"] and float(csv_row["logp_b"]) == row["logp_b"]
    assert float(csv_row["match_all_a"]) == row["match_all_a"] and csv_row["answers"] == "|".join(row["answers"])
    seg = load_probe(spec, smollm2.tokenizer, smollm2.config.seq_len).segments[0]
    t = seg.target
    assert row["task"] == "niah_single_1" and row["answers"] == list(t.answers)
    for side, attention in (("a", "causal"), ("b", "sink:4,64")):
        logits = smollm2.logits(seg.tokens, attention=attention)
        rows = [_log_softmax(logits[p - 1]) for p in range(t.start, t.start + t.length)]
        truth = [int(seg.tokens[p]) for p in range(t.start, t.start + t.length)]
        assert row[f"logp_{side}"] == pytest.approx(sum(r[k] for r, k in zip(rows, truth, strict=True)), rel=1e-9)
        ranks = [
            1 + int((logits[p - 1] > logits[p - 1][k]).sum())
            for p, k in zip(range(t.start, len(seg)), truth, strict=True)
        ]
        assert row[f"ranks_{side}"] == ranks
        if max(ranks) == 1:  # the answer is the greedy chain (numpy's argmax above): nothing more to decode
            assert row[f"greedy_{side}"] == t.key
        else:  # decoded for real: what Model.generate writes, greedy, until an end token
            prompt = seg.tokens[: t.start].tolist()
            generated = smollm2.generate(prompt, steps=t.start + t.generate, attention=attention)
            assert row[f"greedy_{side}"] == generated.text[len(smollm2.tokenizer.decode_sequence(prompt)) :].strip()
        share = sum(a.lower() in row[f"greedy_{side}"].lower() for a in t.answers) / len(t.answers)
        assert row[f"match_all_{side}"] == share
        assert report["summary"][f"ruler_score_{side}"] == round(share * 100, 2)
    assert row["match_all_a"] == 1.0 and max(row["ranks_a"]) == 1  # SmolLM2 finds the number with its whole cache
    assert row["match_all_b"] == 0.0  # and not with 4 sinks and a 64-position window


def test_chat_frame_rendered_once_gives_the_same_tokens(smollm2):
    """Sizing renders the chat template once around a mark: the tokens are those of rendering it
    for every trial size."""
    for task in ("cwe", "niah_multiquery"):
        fast = ruler_sample(smollm2.tokenizer, task, 1200, 2, True)
        slow = ruler_sample(smollm2.tokenizer, task, 1200, 2, True, fast=False)
        assert np.array_equal(fast.tokens, slow.tokens) and fast.target == slow.target
