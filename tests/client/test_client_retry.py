"""RetryPolicy: the service-config JSON, and gRPC retrying UNAVAILABLE (only) on a real server.

Attempts are counted where they land: the server's ``embed_requests_total`` by code.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

import grpc
import pytest

from client import AsyncEmbeddingClient, EmbeddingClient, EmbeddingError
from client.retry import RetryPolicy
from service.local import ServerHandle
from tests.tiny_model import start


def _count(handle: ServerHandle, series: str) -> float:
    url = f"http://127.0.0.1:{handle.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _settles_at(handle: ServerHandle, series: str, want: float) -> float:
    """The count once it stops moving: the server counts an RPC after its status is sent,
    so the client can see the status first."""
    deadline = time.monotonic() + 10
    got = _count(handle, series)
    while got < want and time.monotonic() < deadline:
        time.sleep(0.02)
        got = _count(handle, series)
    time.sleep(0.2)  # and nothing more arrives
    return _count(handle, series)


UNAVAILABLE = 'embed_requests_total{code="UNAVAILABLE",model="_unknown",rpc="Embed"}'
INVALID = 'embed_requests_total{code="INVALID_ARGUMENT",model="tiny",rpc="Embed"}'
FAST = RetryPolicy(max_attempts=4, initial_backoff_s=0.01, max_backoff_s=0.02)


def test_service_config_json_is_grpcs_schema() -> None:
    policy = RetryPolicy(max_attempts=3, initial_backoff_s=0.25, max_backoff_s=2,
                         backoff_multiplier=1.5)
    assert json.loads(policy.service_config_json()) == {"methodConfig": [{
        "name": [{"service": "embedding.v1.EmbeddingService"}],
        "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.25s", "maxBackoff": "2s",
                        "backoffMultiplier": 1.5, "retryableStatusCodes": ["UNAVAILABLE"]},
    }]}
    options = dict(policy.channel_options())
    assert json.loads(options["grpc.service_config"]) == policy.service_config()
    assert options["grpc.enable_retries"] == 1


@pytest.mark.parametrize("kwargs", [{"max_attempts": 1}, {"max_attempts": 6},
                                    {"initial_backoff_s": 0}, {"backoff_multiplier": 0},
                                    {"retryable_status_codes": ()}])
def test_bad_policy_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_unavailable_is_retried_max_attempts_times(tmp_path: Path) -> None:
    handle = start(tmp_path)  # no model: every Embed is UNAVAILABLE
    try:
        with (EmbeddingClient(handle.target, timeout=30, retry=FAST) as c,
              pytest.raises(EmbeddingError) as err):
            c.embed("hello world")
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert _settles_at(handle, UNAVAILABLE, 4) == 4  # the first attempt and 3 retries
        # No policy: one attempt.
        with EmbeddingClient(handle.target, timeout=30) as c, pytest.raises(EmbeddingError):
            c.embed("hello world")
        assert _settles_at(handle, UNAVAILABLE, 5) == 5

        async def once() -> None:
            async with AsyncEmbeddingClient(handle.target, timeout=30, retry=FAST) as ac:
                with pytest.raises(EmbeddingError):
                    await ac.embed("hello world")

        asyncio.run(once())
        assert _settles_at(handle, UNAVAILABLE, 9) == 9  # the async client takes it too
    finally:
        handle.stop()


def test_other_codes_are_not_retried(tiny_repo: Path) -> None:
    handle = start(tiny_repo)
    try:
        with EmbeddingClient(handle.target, timeout=30, retry=FAST) as c:
            with pytest.raises(EmbeddingError) as err:
                c.embed(ids=[-1])
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert _settles_at(handle, INVALID, 1) == 1
            assert c.embed("hello world").token_ids == [31373, 995]
    finally:
        handle.stop()
