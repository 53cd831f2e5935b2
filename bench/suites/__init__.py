"""The suites ``make bench`` runs, each a ``run(cfg, log) -> SuiteResult``: serving (every
way out of the service against its ceiling, lookup floor and naive baseline), scaling
(packed batches, ``--workers``), overload (fast refusals past the queue budget) and memory
(start-up and resident memory of real table sizes), and profile (where a T=16 request's
server CPU goes, by stage, from a sampling profiler)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.harness.config import BenchConfig
from bench.harness.report import SuiteResult
from bench.suites import memory, overload, profile, scaling, serving

__all__ = ["SUITES"]

SUITES: dict[str, Callable[[BenchConfig, Any], SuiteResult]] = {
    "serving": serving.run, "scaling": scaling.run, "overload": overload.run,
    "memory": memory.run, "profile": profile.run}
