"""The suites ``make bench`` runs, each a ``run(cfg, log) -> SuiteResult`` ending in target
lines; docs/performance.md says what each measures."""

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
