"""The real stories260K GGUF files (made with llama.cpp's converter) against llama.cpp and run.c.

Golden outputs come from independent programs only: llama.cpp (``reference-llamacpp.jsonl``,
``evalcb-*.log``) and llama2.c's run.c (``reference-stories260K.jsonl``); see the shared README.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from gguf_reference import SHARED_MODELS

from pyllama.checkpoint import load_checkpoint
from pyllama.cli import main
from pyllama.model import Model
from pyllama.trace import _corners, parse_evalcb_log, summarize, trace_prompt

HELLO_WORLD = [1, 346, 306, 414, 263, 304, 341]  # "Hello world" as llama.cpp tokenises it (BOS first)
# Tolerances of the trace against llama.cpp's F32 log (values are the callback's float32 sums):
# * F32 file: two correct float32 engines that sum in different orders (ggml's blocked matmul vs
#   our 16-lane dots) differ by float32 rounding amplified through 5 layers, and the log prints 6
#   decimals: measured worst 5.6e-6 (result_norm); 2e-5 relative.
# * F16 and Q8_0 files against the same F32 log: the difference is the files' own rounding, so it is
#   bounded relative to the magnitude of what is summed, |Δ| <= tol · Σ|values|. F16 weights carry
#   2^-11 relative error (u of binary16), which through 5 layers measures below 1e-3: 4e-3. Q8_0 rounds
#   weights and activations to 1/254 of each 32-block's largest value, compounding to a measured
#   5.6e-2 in the last layer: 0.1.
TRACE_REL_F32 = 2e-5
TRACE_ABS_OF_L1 = {"f16": 4e-3, "q8_0": 0.1}


def shared(name: str):
    path = SHARED_MODELS / name
    if not path.exists():
        pytest.skip(f"{name} is not present in the shared models folder ({SHARED_MODELS})")
    return path


def read_jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in shared(name).read_text().splitlines() if line.strip()]


def load_model(name: str, threads: int = 2) -> Model:
    cfg, weights = load_checkpoint(shared(name))
    return Model(cfg, weights, None, name, threads=threads)


def _runs(name: str, keep=lambda run: True) -> list:
    """The runs of a reference file as test parameters (one skipped parameter when it is absent)."""
    path = SHARED_MODELS / name
    if not path.exists():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{name} is not present in {SHARED_MODELS}"))]
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [pytest.param(r, id=f"{r.get('model', 'run.c')}-{r['prompt'] or 'empty'}") for r in runs if keep(r)]


@pytest.mark.parametrize("run", _runs("reference-llamacpp.jsonl"))
def test_greedy_ids_match_llama_cpp(run):
    """Exact ids; and our top-1 minus top-2 log-probabilities track llama.cpp's, which shows how far
    any near-tie is (the smallest margin in these runs is 0.07, far from a tie)."""
    model = load_model(run["model"])
    prompt = run["prompt_ids"]
    out = model.generate(prompt, steps=len(prompt) + len(run["ids"]) - 1, temperature=0.0)
    assert out.ids == run["ids"]
    engine = model.engine("causal")
    margins = []
    for pos, token in enumerate((prompt + run["ids"])[:-1]):
        logits = np.asarray(engine.forward(token, pos), dtype=np.float64)
        if pos >= len(prompt) - 1:
            top2 = np.sort(logits)[-2:]
            margins.append(top2[1] - top2[0])  # log-softmax keeps differences of logits
    # F32 and Q8_0 reproduce llama.cpp's arithmetic up to summation order (measured < 5e-6); for F16
    # llama.cpp rounds the activations to fp16 before its F16 matmuls while pyllama keeps float32,
    # which moves the margins by up to 6e-3 (measured). A last-bit difference (the F32 ffn_down of
    # these files sums in another order) can flip one int8 rounding of a Q8_0 activation: that moves
    # a margin by about a block's largest value / 127 (one flip of 7e-2 measured, at the last
    # position of "Once upon a time"), so Q8_0 allows it at one position in 32.
    tol = 1e-2 if "f16" in run["model"] else 1e-4
    close = np.isclose(margins, run["top1_minus_top2_logprob"], atol=tol, rtol=0)
    flips = 1 if "q8_0" in run["model"] else 0
    assert (~close).sum() <= flips and np.allclose(margins, run["top1_minus_top2_logprob"], atol=0.1)


def test_prompts_tokenise_as_llama_cpp_does():
    runs = read_jsonl("reference-llamacpp.jsonl")
    model = Model.load(shared("stories260K-f32.gguf"))
    for run in runs:
        assert model.tokenize(run["prompt"]) == run["prompt_ids"]


@pytest.mark.parametrize("run", _runs("reference-stories260K.jsonl", keep=lambda r: r["temperature"] == 0))
def test_f32_gguf_generates_run_c_ids_like_the_bin(run):
    model = load_model("stories260K-f32.gguf")
    # the file says context_length 128 (the converter's default); the checkpoint was trained on 512
    out = model.generate(run["prompt_ids"], steps=run["steps"], temperature=0.0, attention="causal:positions=512")
    assert out.ids == run["ids"]


def test_f32_gguf_logits_equal_the_bins_bitwise():
    """Same weights, same arithmetic (run.c's, asked for: a GGUF file gets ggml's by default)."""
    gg, bn = Model.load(shared("stories260K-f32.gguf"), arithmetic="run.c"), load_model("stories260K.bin")
    a, b = gg.engine("causal"), bn.engine("causal")
    for pos, token in enumerate([1, 403, 407, 261, 378, 432, 383]):
        assert np.array_equal(a.forward(token, pos), b.forward(token, pos))


def test_config_of_the_llama2c_conversion():
    cfg, weights = load_checkpoint(shared("stories260K-q8_0.gguf"))
    assert (cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size) == (
        64,
        172,
        5,
        8,
        4,
        512,
    )
    assert cfg.seq_len == 128 and cfg.rope_theta == 10000.0 and cfg.rope_style == "normal"
    assert not cfg.shared_classifier  # the converter stores a copy of the embedding as output.weight
    assert weights.layers[0].w2.qtype.name == "F32" and weights.layers[0].w1.qtype.name == "Q8_0"


# ---- trace -----------------------------------------------------------------------------------------


def test_evalcb_log_parses_to_the_shared_sums():
    log = parse_evalcb_log(shared("evalcb-stories260K-f32-hello_world.log"))
    sums = json.loads(shared("evalcb-stories260K-f32-hello_world.sums.json").read_text())
    assert log.sums() == sums
    assert log.corners_only  # this llama.cpp version sums only the values it prints
    assert log.entries["Qcur-0"].ne == (8, 8, 7) and log.entries["result_output"].ne == (512,)


@pytest.mark.parametrize("qtype", ["f32", "f16", "q8_0"])
def test_trace_matches_llama_cpps_f32_log(qtype):
    log = parse_evalcb_log(shared("evalcb-stories260K-f32-hello_world.log"))
    trace = trace_prompt(load_model(f"stories260K-{qtype}.gguf"), HELLO_WORLD)
    rows = summarize(trace, log)
    n_layers = 5
    expected = {"inp_embd", "result_norm", "result_output"} | {
        f"{base}-{layer}"
        for layer in range(n_layers)
        for base in (
            "attn_norm",
            "Qcur",
            "Kcur",
            "Vcur",
            "kqv_merged_cont",
            "kqv_out",
            "ffn_inp",
            "ffn_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_gate_par",
            "ffn_out",
            "l_out",
        )
    }
    assert {r.name for r in rows} == expected
    assert all(r.reference is not None for r in rows)
    assert trace["l_out-4"].positions == 1 and trace["kqv_out-4"].positions == 7
    for row, tensor in zip(rows, trace.tensors, strict=True):
        if qtype == "f32":
            assert row.rel_diff <= TRACE_REL_F32, (row.name, row.ours, row.reference)
        else:
            l1 = np.abs(_corners(tensor.data.reshape(log.entries[row.name].ne[::-1]), 3)).sum()
            assert row.abs_diff <= TRACE_ABS_OF_L1[qtype] * l1, (row.name, row.ours, row.reference)


def test_trace_cli_compares_with_the_log():
    result = CliRunner().invoke(
        main,
        [
            "trace",
            str(shared("stories260K-f32.gguf")),
            "-i",
            "Hello world",
            "--compare",
            str(shared("evalcb-stories260K-f32-hello_world.log")),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["prompt_ids"] == HELLO_WORLD
    assert len(out["tensors"]) == 68 and max(t["rel_diff"] for t in out["tensors"]) <= TRACE_REL_F32


def test_trace_cli_refuses_a_log_of_another_model():
    """SmolLM2's log has none of stories260K's tensor sizes: one line, not a table of 'different size'."""
    log = shared("evalcb-smollm2-hello_world.log")
    args = ["trace", str(shared("stories260K-f32.gguf")), "-i", "Hello world", "--compare", str(log)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "none of its tensors matches" in result.output


def test_trace_without_log_sums_everything():
    model = load_model("stories260K-f32.gguf")
    rows = summarize(trace_prompt(model, HELLO_WORLD))
    embd = next(r for r in rows if r.name == "inp_embd")
    emb = np.asarray(model.weights.token_embedding.data)
    assert embd.values == 7 * 64 and embd.ours == pytest.approx(
        float(emb[HELLO_WORLD].astype(np.float64).sum()), abs=1e-4
    )


# ---- conversion round trip ---------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", ["f32", "f16", "q8_0"])
def test_convert_reproduces_llama_cpps_files(tmp_path, qtype):
    """pyllama convert writes the same tensors, byte for byte, as llama.cpp's converter + quantiser."""
    import gguf

    out = tmp_path / f"s-{qtype}.gguf"
    result = CliRunner().invoke(
        main, ["convert", str(shared("stories260K.bin")), str(out), "--type", qtype, "-z", str(shared("tok512.bin"))]
    )
    assert result.exit_code == 0, result.output
    ours, theirs = gguf.GGUFReader(out), gguf.GGUFReader(shared(f"stories260K-{qtype}.gguf"))
    a, b = {t.name: t for t in ours.tensors}, {t.name: t for t in theirs.tensors}
    assert sorted(a) == sorted(b)
    if qtype == "f32":
        assert list(a) == list(b)  # the converter's order (llama-quantize reorders for F16/Q8_0)
    for name, t in b.items():
        assert a[name].tensor_type == t.tensor_type and list(a[name].shape) == list(t.shape)
        assert np.array_equal(a[name].data.view(np.uint8), t.data.view(np.uint8)), name
    for key in (
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.model",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id",
        "llama.embedding_length",
        "llama.feed_forward_length",
        "llama.block_count",
        "llama.attention.head_count",
        "llama.attention.head_count_kv",
        "llama.rope.dimension_count",
        "llama.attention.layer_norm_rms_epsilon",
    ):
        assert ours.fields[key].contents() == theirs.fields[key].contents(), key
    assert ours.fields["llama.context_length"].contents() == 512  # the checkpoint's, not the converter's 128


def test_converted_f32_generates_the_bins_ids(tmp_path):
    out = tmp_path / "s.gguf"
    CliRunner().invoke(main, ["convert", str(shared("stories260K.bin")), str(out), "-z", str(shared("tok512.bin"))])
    run = read_jsonl("reference-stories260K.jsonl")[0]
    cfg, weights = load_checkpoint(out)
    assert cfg.seq_len == 512
    model = Model(cfg, weights, None, str(out), threads=2)
    assert model.generate(run["prompt_ids"], steps=run["steps"], temperature=0.0).ids == run["ids"]


def test_gguf_generation_stops_on_end_of_generation_tokens_not_on_bos():
    # llama.cpp ends a generation on the vocabulary's end-of-generation tokens (here EOS, id 2, from
    # tokenizer.ggml.eos_token_id) and runs on past BOS; run.c stops on BOS. Greedy "Lily and Tom"
    # samples BOS after a first story (checked with llama.cpp's llama-simple: it prints `<s>` there
    # and goes on with a second story).
    import gguf

    reader = gguf.GGUFReader(shared("stories260K-f32.gguf"))
    eos = int(reader.fields["tokenizer.ggml.eos_token_id"].parts[-1][0])
    gg = Model.load(shared("stories260K-f32.gguf"))
    assert gg.stop_ids == {eos} and 1 not in gg.stop_ids
    bn = Model.load(shared("stories260K.bin"), tokenizer=shared("tok512.bin"))
    assert bn.stop_ids == {1}

    runc_like = bn.generate("Lily and Tom", steps=512)
    assert runc_like.stopped_on_bos
    n = len(runc_like.ids)
    cpp_like = gg.generate("Lily and Tom", steps=512, attention="causal:positions=512")
    assert cpp_like.ids[:n] == runc_like.ids  # same logits, bit for bit
    assert cpp_like.ids[n] == 1 and len(cpp_like.ids) > n + 1 and cpp_like.stop_token in (None, eos)


def test_gguf_stop_ids_end_sampled_tokens_only():
    gg = Model.load(shared("stories260K-f32.gguf"))
    free = gg.generate("Once upon a time", steps=40, ignore_eos=True)
    target = free.ids[5]
    first = free.ids.index(target)
    gg.tokenizer.vocab.eog_ids = {target}
    stopped = gg.generate("Once upon a time", steps=40)
    assert stopped.ids == free.ids[:first] and stopped.stop_token == target
    # a stop token forced by the prompt does not stop a GGUF model (llama.cpp never looks there) ...
    prompt = gg.tokenize("Once upon a time") + [target, 261]
    assert len(gg.generate(prompt, steps=40).ids) > 0
    # ... but run.c stops on a BOS that comes next in the prompt
    bn = Model.load(shared("stories260K.bin"), tokenizer=shared("tok512.bin"))
    forced = bn.generate([1, 403, 1, 407], steps=40)
    assert forced.stopped_on_bos and forced.ids == [] and forced.steps == 2
