"""Benchmarks: a transport ceiling, a naive baseline and the service, in one interleaved run.

``python -m bench`` (``make bench``) starts each server in its own process, drives them
from one load generator on loopback, and writes ``bench/results/bench.{json,png}``.
"""

from __future__ import annotations

__all__: list[str] = []
