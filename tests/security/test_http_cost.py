"""REST requests are refused from what they declare before any per-item work, with the
limits and messages of the gRPC form (tests/security/test_cost.py): the server's own time
(the frame's request duration) for a refused request does not grow with its declared
count, and a million one-byte texts cost what parsing their JSON costs, not a walk over
each one (before: most of a second on the event loop).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest

from service.local import ServerHandle
from tests.security.conftest import LIMITS, TOKEN, server_seconds
from tests.service.rpc.http.conftest import request

HTTP_AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_INPUTS = LIMITS["max_inputs_per_request"]
RPC = "http/ModelInfer"


def texts(shape: list[int], data: list[Any]) -> bytes:
    return json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape,
                                   "data": data}]}).encode()


def ids(shape: list[int], data: list[Any]) -> bytes:
    return json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": shape,
                                   "data": data}]}).encode()


def refused_in(guarded: ServerHandle, body: bytes, message: str, reps: int = 3) -> float:
    """The median server seconds of ``reps`` identical requests, each refused with 400
    and ``message``."""
    costs = []
    for _ in range(reps):
        before = server_seconds(guarded, RPC)
        reply = request(guarded.http_port, "POST", "/v2/models/tiny/infer", body, HTTP_AUTH)
        assert (reply.status, reply.json()) == (400, {"error": message})
        after = server_seconds(guarded, RPC)
        assert after[1] == before[1] + 1
        costs.append(after[0] - before[0])
    return statistics.median(costs)


CASES: dict[str, tuple[Callable[[int], bytes], Callable[[int], str]]] = {
    "text [B], one string": (lambda b: texts([b], ["hi"]),
                             lambda b: f"input 'text' [{b}] needs {b} strings; got 1"),
    "text [B, 1], one string": (lambda b: texts([b, 1], [["hi"]]),
                                lambda b: f"input 'text' [{b}, 1] needs {b} strings; got 1"),
    "input_ids [B, 1], one id": (lambda b: ids([b, 1], [1]),
                                 lambda b: f"input 'input_ids' [{b}, 1] needs {b} values in "
                                           f"data; got 1"),
    "text [B, 0]": (lambda b: texts([b, 0], []),
                    lambda b: f"input 'text' has shape [{b}, 0]; expected [B] (or [B, 1]) "
                              f"with every dimension >= 1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refusal_cost_does_not_grow_with_what_is_declared(guarded: ServerHandle,
                                                          case: str) -> None:
    body, message = CASES[case]
    small = refused_in(guarded, body(10), message(10))
    large = refused_in(guarded, body(1_000_000), message(1_000_000))
    print(f"{case}: B=10 {small * 1e6:.0f} µs, B=1e6 {large * 1e6:.0f} µs")
    assert large < 0.02, large
    assert large <= 5 * small + 0.002, (small, large)


def test_a_million_tiny_texts_are_refused_from_their_count(guarded: ServerHandle) -> None:
    """4 MiB of JSON holding 1,000,000 one-byte texts: refused with gRPC's message from
    the count; what it costs is parsing the JSON (in C), not a walk over each text."""
    n = 1_000_000
    body = texts([n], ["x"] * n)
    cost = refused_in(guarded, body, f"inputs has {n} sequences; max_inputs_per_request is "
                                     f"{MAX_INPUTS}", reps=2)
    parse = statistics.median(_time(lambda: json.loads(body)) for _ in range(3))
    print(f"1e6 one-byte texts ({len(body) >> 20} MiB): refused in {cost * 1e3:.0f} ms; "
          f"json.loads alone {parse * 1e3:.0f} ms")
    assert cost < 2 * parse + 0.05, (cost, parse)
    # Over the count by one: refused as cheaply, before any text is encoded.
    over = texts([MAX_INPUTS + 1], ["\ud800"] * (MAX_INPUTS + 1))  # each one invalid
    refused_in(guarded, over, f"inputs has {MAX_INPUTS + 1} sequences; "
                              f"max_inputs_per_request is {MAX_INPUTS}", reps=1)


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
