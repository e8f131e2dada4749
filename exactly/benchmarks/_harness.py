"""Shared pieces of the benchmarks: a result row, a timer, and the table.

A benchmark module exposes ``run(scale: float) -> list[Result]``. ``scale`` is
1.0 for a full run; ``exactly bench --quick`` passes a small one so that the
test suite can check every benchmark still runs.

Figures that depend on the machine are reported as ratios against a baseline
measured side by side in the same run: shared machines are noisy, and a ratio
cancels most of that noise. Absolute figures are printed beside them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class Result:
    """One row of the benchmark table."""

    name: str
    value: float
    unit: str
    baseline_name: str | None = None
    baseline: float | None = None
    # Target for the ratio value/baseline when there is a baseline, otherwise
    # for the value itself. ``higher_is_better`` says which way the target goes.
    target: float | None = None
    higher_is_better: bool = True
    # Shown beside the value (the figures a difference is made of, ...).
    note: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.baseline == 0:
            return None
        return self.value / self.baseline

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        got = self.ratio if self.ratio is not None else self.value
        return got >= self.target if self.higher_is_better else got <= self.target


def interleaved(fns: dict[str, Callable[[], object]], repeat: int = 3) -> dict[str, float]:
    """Best time of each function, running them in turn (A, B, A, B, ...) so
    that a burst of load on the machine hits all of them alike."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(max(1, repeat)):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def format_table(results: list[Result]) -> str:
    """The results as an aligned text table."""
    header = ("benchmark", "value", "baseline", "ratio", "target", "met")
    rows = [header]
    for r in results:
        value = f"{r.value:,.4g} {r.unit}" + (f" ({r.note})" if r.note else "")
        base = f"{r.baseline:,.4g} ({r.baseline_name})" if r.baseline is not None else "-"
        ratio = f"{r.ratio:.3f}" if r.ratio is not None else "-"
        if r.target is None:
            target = "-"
        else:
            target = (">= " if r.higher_is_better else "<= ") + f"{r.target:,.4g}"
        met = {True: "yes", False: "NO", None: "-"}[r.met]
        rows.append((r.name, value, base, ratio, target, met))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
