"""The child process of the fuzz tests: reads one ``TARGET PATH`` line per input on stdin, runs the
target on the file and answers one JSON line: ``{"outcome": "ok" | "pyllama" | "exception", ...}``.

A crash (a signal, an abort) ends this process and a hang never answers: the parent counts both
and starts a new worker. Kept out of the test module so that it imports nothing but pyllama.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _checkpoint(path: str) -> None:
    """Load a model file (either format) and run one position: what ``generate`` would do first."""
    from pyllama.checkpoint import load_checkpoint
    from pyllama.model import Model

    config, weights = load_checkpoint(path)
    model = Model(config, weights, None, path, threads=1)
    model.forward(min(1, config.vocab_size - 1), 0)


def _tokenizer(path: str) -> None:
    """Load a tokenizer file (either format) and round-trip a little text."""
    from pyllama.tokenizer import load_tokenizer

    tok = load_tokenizer(path)
    ids = tok.encode("Once upon a time, Lily saw a cat.\n\u00e9\u2581<s>", bos=None, eos=False)
    decoder = tok.decoder(ids[0] if ids else 1)
    for i in ids:
        decoder.feed(int(i))
    decoder.flush()


def _crash(path: str) -> None:
    os.abort()  # the test of the harness: a crash must be counted as one


def _hang(path: str) -> None:
    time.sleep(3600)  # the test of the harness: so must a hang


TARGETS = {
    "checkpoint": _checkpoint,
    "tokenizer": _tokenizer,
    "ping": lambda path: None,
    "selftest-crash": _crash,
    "selftest-hang": _hang,
}


def main() -> None:
    import pyllama.checkpoint  # noqa: F401 - imported before the first input, so its time is not the input's
    import pyllama.model  # noqa: F401
    import pyllama.tokenizer  # noqa: F401
    from pyllama.errors import PyllamaError

    for line in sys.stdin:
        target, _, path = line.rstrip("\n").partition(" ")
        try:
            TARGETS[target](path)
            answer = {"outcome": "ok"}
        except PyllamaError as exc:
            answer = {"outcome": "pyllama", "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - what the fuzzer looks for: reported, never raised here
            answer = {
                "outcome": "exception",
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=-4),
            }
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
