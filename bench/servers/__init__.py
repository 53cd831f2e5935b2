"""The reference servers: ``ceiling`` (the transport alone), ``floor`` (the transport and the
lookup), ``naive`` (the obvious implementation); each ``python -m bench.servers.<name>``."""

from __future__ import annotations

__all__: list[str] = []
