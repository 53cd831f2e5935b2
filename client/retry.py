"""Retries of UNAVAILABLE through gRPC's own service-config retry policy.

gRPC retries a call transparently when its method's service config carries a
``retryPolicy``, i.e. below the application, with backoff and jitter, and only while it is
safe: a call is retried until the server has sent it any response (for ``EmbedStream``: the
first one); after that the status goes to the application. UNAVAILABLE is what a client
sees when a server process dies or drains, before any work is done on the retried call, so
retrying it cannot duplicate a result. ``EmbedStream`` calls broken after their first
response must be resumed by the application from the first unanswered request (responses
come in request order).

    EmbeddingClient(target, retry=RetryPolicy(max_attempts=5))

The same JSON works in any gRPC language (``RetryPolicy().service_config_json()``);
see docs/client.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["SERVICE_NAME", "RetryPolicy"]

SERVICE_NAME = "embedding.v1.EmbeddingService"


def _duration(seconds: float) -> str:
    # The service config's Duration: decimal seconds with an "s" suffix, at most 9 decimals.
    return f"{seconds:.9f}".rstrip("0").rstrip(".") + "s"


@dataclass(frozen=True)
class RetryPolicy:
    """gRPC retry policy for every method of ``embedding.v1.EmbeddingService``.

    ``max_attempts`` counts the first attempt (gRPC caps it at 5). The n-th retry waits a
    random time in [0, min(initial_backoff * multiplier^(n-1), max_backoff)] seconds.
    """

    max_attempts: int = 5
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 1.0
    backoff_multiplier: float = 2.0
    retryable_status_codes: tuple[str, ...] = ("UNAVAILABLE",)

    def __post_init__(self) -> None:
        if not 2 <= self.max_attempts <= 5:
            raise ValueError(f"max_attempts={self.max_attempts}: gRPC allows 2..5")
        if self.initial_backoff_s <= 0 or self.max_backoff_s <= 0:
            raise ValueError("initial_backoff_s and max_backoff_s must be > 0")
        if self.backoff_multiplier <= 0:
            raise ValueError("backoff_multiplier must be > 0")
        if not self.retryable_status_codes:
            raise ValueError("retryable_status_codes must not be empty")

    def service_config(self) -> dict[str, Any]:
        """The service config as a dict (gRPC's JSON schema, camelCase names)."""
        return {"methodConfig": [{
            "name": [{"service": SERVICE_NAME}],
            "retryPolicy": {
                "maxAttempts": self.max_attempts,
                "initialBackoff": _duration(self.initial_backoff_s),
                "maxBackoff": _duration(self.max_backoff_s),
                "backoffMultiplier": self.backoff_multiplier,
                "retryableStatusCodes": list(self.retryable_status_codes),
            },
        }]}

    def service_config_json(self) -> str:
        """The service config as JSON, for ``grpc.service_config`` in any language."""
        return json.dumps(self.service_config(), indent=2)

    def channel_options(self) -> list[tuple[str, Any]]:
        """grpc channel options that install the policy (retries are on by default in
        grpc >= 1.40; ``grpc.enable_retries`` says so explicitly)."""
        return [("grpc.service_config", json.dumps(self.service_config())),
                ("grpc.enable_retries", 1)]
