"""The figures a tool contributes to a fleet sweep: its typed contract with whoever compares nodes.

As nccl-tests keeps each collective's bandwidth formula (getBw) in that collective's own record, each
tool that measures something a sweep compares across nodes declares it in its own module:

    SWEEP = SweepContract(
        figures=(MAMF := Figure("mamf_tflops", "TFLOPS", "higher"),),
        read=lambda result: [Measured(MAMF, result.mamf_tflops, expected=result.published_mamf_tflops)])

and passes it as `ToolSpec(sweep=SWEEP)`. `read` takes the tool's own typed Result, so a renamed
field raises AttributeError in tests/test_sweep_contract.py instead of becoming None in a sweep; the
sweep never reads another tool's fields by name. Each figure's margin and measured spread live in
knowledge/data/verdict_rules.toml under the same name (the test checks that too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Figure:
    name: str                          # the key in verdict_rules.toml
    unit: str
    better: Literal["higher", "lower"]
    per_gpu: bool = False              # one value per GPU (compared with the same GPU model's peers)


@dataclass(frozen=True)
class Measured:
    figure: Figure
    value: float | None
    gpu: int | None = None
    expected: float | None = None      # the published or datasheet figure a healthy device reaches, same unit
    group: str | None = None           # what it may be compared with: the GPU model for per-GPU figures


@dataclass(frozen=True)
class SweepContract:
    figures: tuple[Figure, ...]
    read: Callable[[Any], list[Measured]]        # the tool's own Result -> its figures
    evidence: Callable[[Any], list[str]] = field(default=lambda result: [])   # sentences worth keeping on a row

    def measure(self, result) -> list[Measured]:
        """read(), checked against the declaration: an undeclared figure is the tool's bug, said at once."""
        out = self.read(result)
        for m in out:
            if m.figure not in self.figures:
                raise ValueError(f"figure {m.figure.name!r} was read but not declared in the sweep contract")
        return out
