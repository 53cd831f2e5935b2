"""Progress on stderr: tqdm's bar where tqdm is installed (the ``train`` extra), plain-text
lines where it is not.

``make run`` trains the default model in the runtime environment, which has no tqdm; the
job's progress must show all the same. The plain printer writes one line every
``interval`` seconds and a last one at the end, in tqdm's words (``train: 100% 600/600
step, loss=...``), so logs read alike either way.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol

__all__ = ["Progress", "TextProgress", "progress_bar"]


class Progress(Protocol):
    """The part of tqdm's interface the training job uses."""

    def update(self, n: int = 1) -> Any:
        """Count ``n`` more units."""

    def set_postfix(self, **kwargs: Any) -> Any:
        """Show these name=value pairs after the count."""

    def close(self) -> Any:
        """Finish (the plain printer writes its last line)."""

    def __enter__(self) -> Any:
        """The bar itself."""

    def __exit__(self, *exc: object) -> Any:
        """close(): a bar ends its line even when the work in it fails, so a refusal
        printed next starts a line of its own."""


def _scaled(n: float) -> str:
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= factor:
            return f"{n / factor:.2f}{suffix}"
    return f"{n:.0f}"


class TextProgress:
    """tqdm's subset as plain lines on stderr, at most one per ``interval`` seconds."""

    def __init__(self, desc: str, total: int | None = None, initial: int = 0, unit: str = "it",
                 unit_scale: bool = False, disable: bool = False, interval: float = 10.0
                 ) -> None:
        self.desc, self.total, self.unit = desc, total, unit
        self.unit_scale, self.disable, self.interval = unit_scale, disable, interval
        self.n = self._start_n = initial
        self._postfix = ""
        self._start = self._last = time.monotonic()
        self._closed = False

    def update(self, n: int = 1) -> None:
        """Count ``n`` more units; write a line if ``interval`` has passed since the last."""
        self.n += n
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._write(now)

    def set_postfix(self, **kwargs: Any) -> None:
        """Show these name=value pairs after the count, from the next line on."""
        self._postfix = ", ".join(f"{k}={v}" for k, v in kwargs.items())

    def close(self) -> None:
        """Write the last line (once)."""
        if not self._closed:
            self._closed = True
            self._write(time.monotonic())

    def __enter__(self) -> TextProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def line(self, now: float) -> str:
        """The line as it would be written at monotonic time ``now``."""
        count = _scaled(self.n) if self.unit_scale else str(self.n)
        if self.total:
            count = f"{100 * self.n // self.total}% {count}/{self.total}"
        rate = (self.n - self._start_n) / max(now - self._start, 1e-9)
        rate_text = _scaled(rate) if self.unit_scale else f"{rate:.2f}"
        text = f"{self.desc}: {count} {self.unit} [{now - self._start:.0f} s, "
        text += f"{rate_text} {self.unit}/s]"
        return f"{text}, {self._postfix}" if self._postfix else text

    def _write(self, now: float) -> None:
        if not self.disable:
            print(self.line(now), file=sys.stderr, flush=True)


def progress_bar(desc: str, total: int | None = None, initial: int = 0, unit: str = "it",
                 unit_scale: bool = False, disable: bool = False) -> Progress:
    """tqdm's bar when tqdm is installed, else a ``TextProgress`` with the same arguments.
    Use it as ``with progress_bar(...) as bar:``, so the bar is closed (its line ended) when
    the work fails too: otherwise the error line is glued to the bar's."""
    try:
        from tqdm import tqdm
    except ImportError:  # the runtime environment: tqdm is an extra
        return TextProgress(desc, total, initial, unit, unit_scale, disable)
    bar: Progress = tqdm(desc=desc, total=total, initial=initial, unit=unit,
                         unit_scale=unit_scale, disable=disable)
    return bar
