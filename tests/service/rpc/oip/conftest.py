"""Drive the real tritonclient in its own process (see triton_driver) against real servers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

DRIVER = Path(__file__).with_name("triton_driver.py")
Triton = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="session")
def triton() -> Triton:
    """``triton(target, calls, headers=None)`` → one result per call."""
    def call(target: str, calls: list[dict[str, Any]],
             headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
        spec = json.dumps({"target": target, "calls": calls, "headers": headers or {}})
        proc = subprocess.run([sys.executable, str(DRIVER)], input=spec, capture_output=True,
                              text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        results: list[dict[str, Any]] = json.loads(proc.stdout)
        return results

    return call
