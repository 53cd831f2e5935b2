"""What embedctl prints and saves: the lines of an embedding, token strings, the array file.

``save_array`` writes ``.npy`` at exactly the path given (np.save, handed a name, appends
``.npy`` to one without it), whole or not at all.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from client.codec import Embedding
from client.files import write_atomically

__all__ = ["PREVIEW_COLS", "PREVIEW_ROWS", "format_embedding", "save_array", "token_text"]

PREVIEW_ROWS = 4
PREVIEW_COLS = 6


def token_text(token: bytes) -> str:
    # A BPE token may be a partial UTF-8 sequence: show those as bytes, not as U+FFFD.
    try:
        return repr(token.decode("utf-8"))
    except UnicodeDecodeError:
        return repr(token)


def _us(ns: int) -> str:
    return f"{ns / 1000:.0f} us"


def format_embedding(e: Embedding) -> list[str]:
    """The lines ``embedctl embed`` prints: shape, identity, ids, a preview, timing."""
    rows, cols = e.array.shape
    widened = ""
    if e.wire_dtype == "bfloat16" and e.array.dtype == np.float32:
        widened = " (widened to float32)"
    lines = [f"shape ({rows}, {cols})  dtype {e.wire_dtype}{widened}",
             f"model {e.model}  version {e.version}  checkpoint {e.checkpoint_id[:12]}",
             f"token_ids {e.token_ids}",
             f"start_position {e.start_position}  truncated_tokens {e.truncated_tokens}  "
             f"untrained_token_indices {e.untrained_token_indices}"]
    for i in range(min(rows, PREVIEW_ROWS)):
        values = " ".join(f"{float(v):+.4f}" for v in e.array[i, :PREVIEW_COLS])
        more = f" ... ({cols} cols)" if cols > PREVIEW_COLS else ""
        lines.append(f"[{i}] {values}{more}")
    if rows > PREVIEW_ROWS:
        lines.append(f"... ({rows - PREVIEW_ROWS} more rows)")
    t = e.timing
    lines.append(f"timing  queue {_us(t.queue_ns)}  tokenize {_us(t.tokenize_ns)}  "
                 f"compute {_us(t.compute_ns)}  total {_us(t.total_ns)}")
    return lines


def save_array(path: Path, array: np.ndarray) -> None:
    """``array`` in .npy format at exactly ``path`` (np.save given a name appends .npy to
    one without it; given a file it writes where told), through a temporary file in the
    same directory renamed into place (a failed write leaves no partial file), with the
    mode any new file gets (0666 less the umask)."""
    write_atomically(path, lambda f: np.save(f, array))
