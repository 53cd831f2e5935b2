"""The benchmarks' harness: launch servers, generate load, judge targets, plot."""

from __future__ import annotations

__all__: list[str] = []
