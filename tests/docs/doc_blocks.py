"""The fenced blocks of README.md and docs/*.md, as the doc tests read them.

A block's info string says what it is: ``bash`` (commands, run as one bash script),
``console`` (a shell session: ``$ command`` lines, each followed by the output it prints),
``python`` and ``js`` (client snippets, run as they are), anything else (``json``, ``yaml``,
``text`` or none) is data, a diagram or an output and is not run. A block that looks like
commands but is not tagged as such is an error (``untagged_commands``): untagged, it would
silently escape the test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RUNNABLE", "Block", "blocks", "doc_files", "session_steps", "untagged_commands"]

RUNNABLE = ("bash", "console", "python", "js")
_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.S | re.M)
# First words of a line that make an untagged block a command block.
_COMMAND_START = re.compile(
    r"^\s*(\$ |make |\.venv/|python |python3 |docker |kubectl |curl |embedctl |node |"
    r"scripts/|torchrun |prometheus |cd |npm |grpcurl |pip |SERVICE_HOSTNAME=)")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language (first word of the info string), its text."""

    path: Path  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    text: str

    @property
    def where(self) -> str:
        """``docs/client.md:18``: what a failure names."""
        return f"{self.path}:{self.line}"


def doc_files(root: Path) -> list[Path]:
    """README.md and every docs/*.md, relative to ``root``."""
    return [Path("README.md"), *sorted(p.relative_to(root) for p in (root / "docs").glob("*.md"))]


def blocks(root: Path) -> list[Block]:
    """Every fenced block of the docs, in file order."""
    found = []
    for rel in doc_files(root):
        text = (root / rel).read_text()
        for m in _FENCE.finditer(text):
            info = m.group(1).strip().split()
            found.append(Block(rel, text.count("\n", 0, m.start()) + 1,
                               info[0] if info else "", m.group(2)))
    return found


def untagged_commands(all_blocks: list[Block]) -> list[Block]:
    """Blocks not tagged runnable whose first non-blank line reads as a shell command."""
    out = []
    for b in all_blocks:
        if b.lang:  # tagged: run (RUNNABLE) or, by choice, data or a synopsis
            continue
        first = next((ln for ln in b.text.splitlines() if ln.strip()), "")
        if _COMMAND_START.match(first):
            out.append(b)
    return out


def session_steps(text: str) -> list[tuple[str, list[str]]]:
    """A ``console`` block as (command, the output lines shown after it) pairs."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"output before the first '$ ' command: {line!r}")
    return steps
