"""The recall probe's construction: its search for the number of filler sentences finds what adding
one sentence at a time finds (the construction it replaced, written out again here as the reference),
on the vocabularies at hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyllama.diff.probes import RECALL_GAPS, _fewest_fillers, _parse_recall, _read_text, load_probe

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


@pytest.mark.parametrize("least", range(8))
@pytest.mark.parametrize("guess", [0, 1, 3, 7, 12])
def test_fewest_fillers_is_the_least_count_from_any_guess(least, guess):
    asked: list[int] = []

    def long_enough(k: int) -> bool:
        asked.append(k)
        return k >= least

    assert _fewest_fillers(long_enough, guess) == least
    # one step at a time from the guess: down to the first count that is too short, or up to the least
    assert len(asked) == (guess - least + 1 + (least > 0) if guess >= least else least - guess + 1)


def _recall_by_single_sentences(tokenizer, seq_len: int) -> list[list[int]]:
    """Each recall sequence built the plain way: a filler at a time until the gap is reached."""
    out = []
    for block in _parse_recall(_read_text("recall.txt")):
        name = block["name"]

        def tokens_of(parts: list[str]) -> list[int]:
            return list(tokenizer.encode(" ".join(parts), bos=True, eos=False))

        def last_mention(ids: list[int], n_mentions: int, name: str = name) -> int:
            for variant in (name, " " + name):
                pattern = list(tokenizer.encode(variant, bos=False, eos=False))
                found = [i for i in range(len(ids) - len(pattern) + 1) if ids[i : i + len(pattern)] == pattern]
                if len(found) == n_mentions:
                    return found[-1]
            raise AssertionError(f"{name}: mentions not found")

        sentences = [block["intro"]]
        ids = tokens_of(sentences)
        last = last_mention(ids, block["intro"].count(name))
        fill_i = recur_i = 0
        for gap in RECALL_GAPS:
            trial = list(sentences)
            while len(tokens_of(trial)) - last < gap:
                trial.append(block["filler"][fill_i % len(block["filler"])])
                fill_i += 1
            trial.append(block["recur"][recur_i % len(block["recur"])])
            trial_ids = tokens_of(trial)
            if len(trial_ids) > seq_len:
                break
            recur_i += 1
            sentences, ids = trial, trial_ids
            last = last_mention(ids, " ".join(sentences).count(name))
        out.append(ids)
    return out


@pytest.mark.parametrize(("tokenizer", "seq_len"), [("tok512.bin", 512), ("tok512.bin", 2048)])
def test_recall_sequences_equal_adding_one_filler_at_a_time(tokenizer, seq_len):
    from pyllama.tokenizer import load_tokenizer

    path = MODELS / tokenizer
    if not path.exists():
        pytest.skip(f"{path} is not here (../shared/models)")
    tok = load_tokenizer(path)
    probe = load_probe("recall", tok, seq_len)
    want = _recall_by_single_sentences(tok, seq_len)
    assert [list(s.tokens) for s in probe.segments] == want
    assert max(len(ids) for ids in want) > seq_len // 2  # long gaps were reached


def test_built_in_probes_are_made_once_per_tokenizer_and_read_only():
    from pyllama.tokenizer import load_tokenizer

    path = MODELS / "tok512.bin"
    if not path.exists():
        pytest.skip(f"{path} is not here (../shared/models)")
    tok = load_tokenizer(path)
    first = load_probe("standard", tok, 512)
    assert load_probe("standard", tok, 512) is first
    assert load_probe("standard", tok, 256) is not first and load_probe("stories", tok, 512) is not first
    other = load_probe("standard", load_tokenizer(path), 512)  # another tokenizer object: built again
    assert other is not first
    assert [list(s.tokens) for s in other.segments] == [list(s.tokens) for s in first.segments]
    with pytest.raises(ValueError, match="read-only"):
        first.segments[0].tokens[0] = 7
