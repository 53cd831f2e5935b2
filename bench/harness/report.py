"""Targets and their verdicts: each one a MET / NOT MET line with its measured value.

A suite measures in interleaved rounds (every server of a point back to back within a
round), so a ratio is computed per round, from figures measured seconds apart under the
same load, and then its median taken: never the ratio of two medians.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["SuiteResult", "Target", "format_targets", "paired"]


@dataclass(frozen=True)
class Target:
    """One target line: a measured value against a bound (``op`` is ">=" or "<="), and,
    where a lookup floor ran, the same figure for the floor: what a server doing the
    lookup and nothing else reached in the same run, the most the service could."""

    name: str
    value: float
    op: str
    bound: float
    floor: float | None = None

    @property
    def met(self) -> bool:
        """Whether the value is on the bound's side; a value not measured (nan) is not."""
        return self.value >= self.bound if self.op == ">=" else self.value <= self.bound

    def line(self) -> str:
        """``[MET    ] name = 0.93 (target >= 0.9)``."""
        verdict = "MET    " if self.met else "NOT MET"
        floor = "" if self.floor is None else f"; the lookup floor: {self.floor:.2f}"
        return (f"[{verdict}] {self.name} = {self.value:.2f} "
                f"(target {self.op} {self.bound:g}{floor})")


def paired(over: Sequence[Sequence[float]], under: Sequence[Sequence[float]]) -> float:
    """The median over rounds of (product of ``over``'s figures) / (product of ``under``'s):
    ``paired([a], [b])`` is a/b per round; ``paired([a, d], [b, c])`` a ratio of ratios."""
    rounds = min(len(s) for s in (*over, *under))
    ratios = []
    for i in range(rounds):
        top, bottom = math.prod(s[i] for s in over), math.prod(s[i] for s in under)
        if bottom > 0:
            ratios.append(top / bottom)
    return statistics.median(ratios) if ratios else math.nan


@dataclass
class SuiteResult:
    """What a suite hands back: its JSON, its printed table, its target lines."""

    name: str
    report: dict[str, Any]
    text: str
    targets: list[Target] = field(default_factory=list)

    def json(self) -> dict[str, Any]:
        """The report with its targets and their verdicts."""
        return {**self.report, "targets": [{**asdict(t), "met": t.met} for t in self.targets]}


def format_targets(targets: Sequence[Target], meta: Mapping[str, Any]) -> str:
    """The target block ``make bench`` ends with."""
    lines = [f"targets (medians of {meta.get('reps', '?')} interleaved rounds; "
             f"{meta.get('ids', 'uniform')} ids): {sum(t.met for t in targets)} of "
             f"{len(targets)} met"]
    lines += ["  " + t.line() for t in targets]
    if meta.get("quick"):
        lines.append("  (--quick: tiny sizes; these verdicts say nothing about the targets)")
    # The run itself loads every core; only load already there before it is other work.
    load, cpus = meta.get("loadavg_before", 0.0), meta.get("cpus")
    if cpus and load > 0.5 * cpus:
        lines.append(f"  warning: load average {load:.1f} on {cpus} CPUs before the run: other "
                     "work on this machine skewed these figures")
    return "\n".join(lines)
