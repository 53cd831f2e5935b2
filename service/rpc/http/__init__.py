"""The Open Inference Protocol's REST form (KServe v2 / Triton HTTP) and the page: a third
front on the engine every front holds (``front.py``)."""

from __future__ import annotations

from service.rpc.http.front import HttpFront
from service.rpc.http.wire import server_ssl_context

__all__ = ["HttpFront", "server_ssl_context"]
