"""SmolLM2's tokenizer against llama.cpp, and chat prompts rendered from a file's own template.

The SmolLM2 file's ``prompt_ids`` in ``reference-smollm2.jsonl`` are llama.cpp's (``llama-tokenize``).
Its weights are Q4_1, so these tests build the tokenizer from the file alone; generation is tested on
random-weight models written here.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import read_jsonl, shared_file
from gguf import GGUFValueType as VT
from gguf_reference import write_random_gguf

from pyllama import chat
from pyllama.checkpoint.gguf import open_gguf
from pyllama.cli import main
from pyllama.errors import InputError
from pyllama.model import Model
from pyllama.tokenizer import load_gguf_tokenizer, load_tokenizer
from pyllama.tokenizer.bpe import BYTE_TO_CHAR

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def smollm2():
    return load_tokenizer(shared_file(SMOLLM2))


def _runs() -> list[dict]:
    return read_jsonl("reference-smollm2.jsonl")


def test_smollm2_prompts_tokenize_as_llama_cpp(smollm2):
    runs = _runs()
    if not runs:
        pytest.skip("reference-smollm2.jsonl is not present")
    for run in runs:
        assert smollm2.encode(run["prompt"]) == run["prompt_ids"], run["prompt"]
    assert {r["prompt"] for r in runs} >= {"Hello world", "Once upon a time", "def fib(n):"}


def test_the_loaders_parse_gives_the_same_tokenizer(smollm2):
    """Model.load's path: the tokenizer built from the records the weights loader parsed."""
    from_records = load_gguf_tokenizer(open_gguf(shared_file(SMOLLM2)))
    text, ids = chat.prompt_ids(from_records, QUESTION)
    assert (text, ids) == chat.prompt_ids(smollm2, QUESTION)
    assert [from_records.encode(r["prompt"]) for r in _runs()] == [r["prompt_ids"] for r in _runs()]


def test_smollm2_vocabulary_facts(smollm2):
    assert (smollm2.vocab_size, smollm2.model, smollm2.vocab.pre) == (49152, "gpt2", "smollm")
    assert smollm2.encode("Hello world") == [19556, 905]  # no BOS: the file says add_bos_token = false
    start, end = smollm2.tokens.index("<|im_start|>"), smollm2.tokens.index("<|im_end|>")
    assert (start, end, smollm2.eos_id) == (1, 2, 2) and end in smollm2.stop_ids
    # control tokens written in the text are the tokens; with special parsing off they are text
    assert smollm2.encode("<|im_start|>user")[0] == start
    assert start not in smollm2.encode("<|im_start|>user", parse_special=False)
    assert smollm2.piece_bytes(end) == b""  # a control token prints nothing


def test_default_chat_prompt_is_the_references_37_ids(smollm2):
    """No system message: the file's template supplies SmolLM's default one."""
    chatml = [r for r in _runs() if r["prompt"].startswith("<|im_start|>")]
    if not chatml:
        pytest.skip("reference-smollm2.jsonl is not present")
    text, ids = chat.prompt_ids(smollm2, QUESTION)
    assert text == chatml[0]["prompt"]
    assert ids == chatml[0]["prompt_ids"] and len(ids) == 37
    system, _ = chat.prompt_ids(smollm2, QUESTION, system="Answer in one word.")
    assert system.startswith("<|im_start|>system\nAnswer in one word.<|im_end|>\n") and "SmolLM" not in system


def test_cli_prints_the_prompt_from_the_vocabulary_alone():
    path = shared_file(SMOLLM2)
    result = CliRunner().invoke(main, ["chat", "-c", str(path), "--print-prompt", QUESTION])
    assert result.exit_code == 0, result.output
    chatml = [r for r in _runs() if r["prompt"].startswith("<|im_start|>")]
    assert json.loads(result.output)["prompt_ids"] == chatml[0]["prompt_ids"]


# ---- templates that are not ChatML ---------------------------------------------------------------
# Written for these tests in the styles of two other model families; the expected texts follow from
# jinja2 with transformers' settings (trim_blocks drops the newline after a block tag, lstrip_blocks
# the indentation before one).
INST = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] | trim + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}{% endif %}{% endfor %}"
)
TURNS = """{% for m in messages %}
<start_of_turn>{{ m['role'] }}
{{ m['content'] }}<end_of_turn>
    {% endfor %}
{% if add_generation_prompt %}
<start_of_turn>model
{% endif %}"""


def test_an_inst_template_renders():
    history = [{"role": "user", "content": " Hi "}, {"role": "assistant", "content": "Hello."}]
    text = chat.render(INST, chat.messages("Bye", history=history), bos_token="<s>", eos_token="</s>")
    assert text == "<s>[INST] Hi [/INST] Hello. </s>[INST] Bye [/INST]"


def test_block_whitespace_is_trimmed_as_transformers_does():
    text = chat.render(TURNS, chat.messages("Hi"), add_generation_prompt=True)
    assert text == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert chat.render(TURNS, chat.messages("Hi"), add_generation_prompt=False).endswith("<end_of_turn>\n")


def test_tojson_keeps_text_and_loop_controls_work():
    template = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m | tojson }}{% endfor %}"
    text = chat.render(template, chat.messages("été", system="s"))
    assert text == '{"role": "system", "content": "s"}'
    assert chat.render("{{ messages[0]['content'] | tojson }}", chat.messages("été")) == '"été"'


@pytest.mark.parametrize(
    "template,words",
    [
        (INST, "the template refuses these messages: roles must alternate"),
        ("{% for m in messages %}{{ m['content'] }", r"does not parse \(line 1\)"),
        ("{{ messages.append(1) }}", "does not render: SecurityError"),  # the sandbox: no mutation
        ("{{ messages[0]['content'] + 1 }}", "does not render: TypeError"),
    ],
)
def test_a_template_that_fails_is_one_line(template, words):
    with pytest.raises(InputError, match=words) as info:
        chat.render(template, chat.messages("Hi", system="s"), source="t.jinja")
    assert str(info.value).startswith("t.jinja: ") and "\n" not in str(info.value)


# ---- generation ------------------------------------------------------------------------------------
CHAT_TOKENS = ["<|im_end|>", "<|im_start|>"]  # <|im_end|> is id 0: what an all-zero classifier picks
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _chat_model(path, zero_classifier: bool, template: str | None = CHATML) -> Model:
    tokens = CHAT_TOKENS + BYTE_TO_CHAR
    vocab = {
        "tokenizer.ggml.model": ("gpt2", VT.STRING),
        "tokenizer.ggml.pre": ("smollm", VT.STRING),
        "tokenizer.ggml.tokens": (tokens, VT.ARRAY),
        "tokenizer.ggml.token_type": ([3, 3] + [1] * 256, VT.ARRAY),
        "tokenizer.ggml.merges": (["Ġ t"], VT.ARRAY),
        "tokenizer.ggml.eos_token_id": (0, VT.UINT32),
    }
    if template is not None:
        vocab["tokenizer.chat_template"] = (template, VT.STRING)
    extra = {"output.weight": np.zeros((len(tokens), 64), np.float32)} if zero_classifier else None
    write_random_gguf(path, vocab=len(tokens), with_vocab=False, extra_kv=vocab, extra_tensors=extra, context=128)
    return Model.load(path, threads=1)


def test_generation_stops_at_im_end(tmp_path):
    model = _chat_model(tmp_path / "zero.gguf", zero_classifier=True)
    result = model.chat("Hi", temperature=0.0)
    assert result.stop_token == 0 and result.ids == [] and result.text == ""
    assert result.prompt_ids == chat.prompt_ids(model.tokenizer, "Hi")[1]


def test_the_reply_alone_is_returned_and_streamed(tmp_path):
    model = _chat_model(tmp_path / "random.gguf", zero_classifier=False)
    streamed: list[str] = []
    result = model.chat("Hi", system="Be brief.", steps=40, temperature=0.0, ignore_eos=True, on_text=streamed.append)
    assert len(result.ids) == 40 - len(result.prompt_ids) + 1
    assert result.text == model.tokenizer.decode(result.prompt_ids[-1:] + result.ids)
    assert "".join(streamed) == result.text
    plain = model.generate(result.prompt_ids, steps=40, temperature=0.0, ignore_eos=True)
    assert plain.ids == result.ids  # the same run as generate on the rendered ids


def test_cli_chat_with_a_template_file(tmp_path):
    path = tmp_path / "m.gguf"
    _chat_model(path, zero_classifier=False, template=None)
    template = tmp_path / "t.jinja"
    template.write_text("<|im_start|>{{ messages[-1]['content'] }}")
    runner = CliRunner()
    args = ["chat", "-c", str(path), "-n", "6", "--template", str(template), "--json", "ab"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    reply = json.loads(result.output)
    assert reply["prompt_ids"] == [1, 2 + ord("a"), 2 + ord("b")] and len(reply["ids"]) <= 4
    result = runner.invoke(main, ["chat", "-c", str(path), "ab"])
    assert result.exit_code == 1 and "has no tokenizer.chat_template" in result.output
    template.write_text("{{ raise_exception('no') }}")
    result = runner.invoke(main, ["chat", "-c", str(path), "--template", str(template), "ab"])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "refuses these messages: no" in result.output


def test_a_prompt_without_bos_is_printed_from_its_first_token():
    """SmolLM2 adds no BOS, so a prompt's first id is a real token ("Once"): generate prints it, as it
    prints every prompt token after a BOS (it was taken for BOS and dropped)."""
    model = Model.load(shared_file(SMOLLM2), threads=1)
    streamed: list[str] = []
    result = model.generate("Once upon a time", steps=6, temperature=0.0, on_text=streamed.append)
    assert result.prompt_ids[0] != model.tokenizer.bos_id and len(result.ids) == 3
    assert result.text.startswith("Once upon a time") and "".join(streamed) == result.text
    assert model.tokenizer.decode_sequence(result.prompt_ids) == "Once upon a time"


def test_a_template_file_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "m.gguf"
    _chat_model(path, zero_classifier=False, template=None)
    template = tmp_path / "t.jinja"
    template.write_bytes(b"<|im_start|>\xff\xfe{{ messages }}")
    result = CliRunner().invoke(main, ["chat", "-c", str(path), "--template", str(template), "ab"])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "not UTF-8 text" in result.output and str(template) in result.output
