"""The training job's one error type for mistakes a person makes in its flags or inputs.

``python -m training`` prints its message as one line and exits 2, without a traceback;
the message names the flag or file and what to do. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A flag or input that cannot work (``--data`` matching nothing, ``--resume`` without
    state, ...); a ValueError, so callers that caught those before still do."""
