"""--max-concurrent-rpcs holds for HTTP too: past it a request is 429 before any work."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.service.rpc.http.conftest import infer_body, request
from tests.tiny_model import start

INFER = "/v2/models/tiny/infer"


def test_requests_past_the_inflight_cap_get_429_and_the_next_one_is_served(
        tiny_repo: Path) -> None:
    # A long batch delay keeps the first request in flight while the second arrives.
    handle = start(tiny_repo, max_concurrent_rpcs=1, max_batch_delay_us=1_500_000)
    try:
        port = handle.server.http_port
        first: list[int] = []
        slow = threading.Thread(target=lambda: first.append(
            request(port, "POST", INFER, infer_body(ids=[[1, 2]])).status))
        slow.start()
        deadline = time.monotonic() + 5
        while handle.server.http is not None and handle.server.http.slots.inflight == 0:
            assert time.monotonic() < deadline, "the first request never arrived"
            time.sleep(0.01)
        refused = request(port, "POST", INFER, infer_body(ids=[[3]]))
        assert (refused.status, refused.json()) == (429, {
            "error": "1 HTTP requests in flight: max_concurrent_rpcs=1; retry later"})
        slow.join(10)
        assert first == [200]
        assert request(port, "POST", INFER, infer_body(ids=[[3]])).status == 200
    finally:
        handle.stop()
