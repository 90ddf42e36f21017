"""Test plugins for the sweep tests, loaded as ``plugins.py:Class``: exact causal attention (the
native cache) that fails or stalls on purpose at a chosen position of a cell."""

import os
import time

from pyllama.attention.spec import Knob
from pyllama.plugins.causal import Causal


class Fragile(Causal):
    description = "causal attention that raises at a chosen position (a plugin bug in one cell)"
    knobs = (
        Knob("positions", int, 0, "cache size in positions; 0 = the model's context", min=0),
        Knob("fail_at", int, -1, "raise after this many positions of the cell; -1 = never", min=-1),
    )

    def __init__(self, positions: int = 0, fail_at: int = -1):
        super().__init__(positions)
        self.fail_at = fail_at
        self.calls = 0

    def memory_bytes(self):  # the harness asks after every position: a hook into the middle of a cell
        if self.calls == self.fail_at:
            raise RuntimeError(f"fragile: failed on purpose after {self.calls} positions")
        self.calls += 1
        return super().memory_bytes()


class Stall(Causal):
    description = "causal attention that, once, writes its pid to a file and stalls in the middle of a cell"
    knobs = (
        Knob("positions", int, 0, "cache size in positions; 0 = the model's context", min=0),
        Knob("marker", str, "", "file to write the worker's pid to before stalling; empty = never stall"),
    )

    def __init__(self, positions: int = 0, marker: str = ""):
        super().__init__(positions)
        self.marker = marker
        self.calls = 0

    def memory_bytes(self):
        self.calls += 1
        if self.calls == 10 and self.marker and not os.path.exists(self.marker):
            with open(self.marker + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(self.marker + ".tmp", self.marker)
            time.sleep(120)  # the test kills this process meanwhile
        return super().memory_bytes()
