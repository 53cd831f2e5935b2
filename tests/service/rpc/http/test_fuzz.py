"""Fuzz the REST front against a real server: bodies, headers and paths.

The property is the gRPC fuzz's own (``test_fuzz.py``): no input is answered with a 5xx
(a 504 only for a request that set ``grpc-timeout``), no traceback reaches the log, the
server's time on a request is bounded by the bytes it was sent (50 ms + 2 µs per byte,
whatever it declares), and a known-good request still gets the same bytes after every
example. Requests are written byte for byte on a socket, so header values and paths can
be anything an attacker's client can put on the wire (invalid UTF-8, control bytes,
non-ASCII digits), and bodies are structured OIP requests with wild fields, deep nesting,
huge numbers, or raw bytes.

``HYPOTHESIS_PROFILE`` picks the budget, as for the gRPC targets (``make fuzz``: long).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from service.local import ServerHandle
from tests.service.rpc.fuzz_strategies import FUZZ

SECONDS_FLOOR = 0.05  # as test_fuzz.py: scheduling noise on a loaded machine, GC
SECONDS_PER_BYTE = 2e-6
GOOD = (b'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 3], '
        b'"data": [1, 2, 3]}], "parameters": {"binary_data_output": true}}')


class _Tracebacks(logging.Handler):
    """Every record with an exception, from any logger (aiohttp's included)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.exc_text:
            self.seen.append(f"{record.name}: {record.getMessage()}")


@pytest.fixture(scope="module")
def tracebacks() -> Iterator[_Tracebacks]:
    handler = _Tracebacks()
    logging.getLogger().addHandler(handler)
    yield handler
    logging.getLogger().removeHandler(handler)


def exchange(port: int, method: bytes, path: bytes, headers: list[tuple[bytes, bytes]],
             body: bytes) -> tuple[int, bytes]:
    """One request written as given (plus Host, Content-Length and Connection: close);
    the status and the body, read to the end."""
    head = b"%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" % (method, path)
    head += b"".join(b"%s: %s\r\n" % kv for kv in headers)
    head += b"Content-Length: %d\r\n\r\n" % len(body)
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        with contextlib.suppress(OSError):  # refused before the body: read the answer
            s.sendall(head + body)
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
    match = re.match(rb"HTTP/1\.[01] (\d{3}) ", data)
    assert match is not None, data[:200]
    return int(match.group(1)), data.partition(b"\r\n\r\n")[2]


def server_seconds(handle: ServerHandle) -> float:
    return sum(child.sum for labels, child  # type: ignore[attr-defined]
               in handle.server.metrics.request_duration._children.items()
               if labels[0].startswith("http/"))


# -- strategies -----------------------------------------------------------------------------

HOSTILE_TEXT = st.sampled_from(["", "²", "٣", "\x00", "\ud800", "é" * 40, "9" * 5000,
                                "../../etc/passwd", "\x1b[2J\n", "-1", "1e999", " 12 "])
NUMBERS = st.integers(-(2**70), 2**70) | st.sampled_from([0, 1, -1, 2**31, 2**63, 2**64]) \
    | st.floats(allow_nan=True, allow_infinity=True)
JSON = st.recursive(st.none() | st.booleans() | NUMBERS | st.text(max_size=8) | HOSTILE_TEXT,
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=12)
SHAPE = st.lists(st.integers(-2, 4) | st.sampled_from([10**6, 2**62, 2**64]), max_size=3)


@st.composite
def tensors(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(st.sampled_from(["input_ids", "text", "other"]) | st.text(max_size=4))
    tensor: dict[str, Any] = {
        "name": name,
        "datatype": draw(st.sampled_from(["INT64", "INT32", "BYTES", "FP32"]) | HOSTILE_TEXT),
        "shape": draw(SHAPE | JSON)}
    if name == "text":
        tensor["data"] = draw(st.lists(st.text(max_size=6) | HOSTILE_TEXT | JSON, max_size=6))
    else:
        tensor["data"] = draw(st.lists(st.integers(-3, 60000) | NUMBERS | JSON, max_size=8)
                              | JSON)
    if draw(st.booleans()):
        tensor["parameters"] = draw(st.dictionaries(
            st.sampled_from(["binary_data_size", "binary_data", "x"]), NUMBERS | JSON,
            max_size=2))
    return tensor


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["oip", "oip", "oip", "json", "bytes", "deep", "mutated"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "json":
        return json.dumps(draw(JSON)).encode()
    if kind == "deep":
        depth = draw(st.integers(1, 200_000))
        return b"[" * depth + b"]" * draw(st.integers(0, depth))
    request: dict[str, Any] = {"inputs": draw(st.lists(tensors(), max_size=2) | JSON)}
    for key, values in (("id", st.text(max_size=8) | HOSTILE_TEXT | JSON),
                        ("parameters", st.dictionaries(st.sampled_from(
                            ["binary_data_output", "start_position", "compose", "truncate",
                             "datatype", "allow_special_tokens", "nope"]),
                            NUMBERS | HOSTILE_TEXT | JSON, max_size=3)),
                        ("outputs", st.lists(st.fixed_dictionaries(
                            {"name": st.sampled_from(["embeddings", "sequence_lengths", "x"])},
                            optional={"parameters": JSON}), max_size=3) | JSON)):
        if draw(st.booleans()):
            request[key] = draw(values)
    data = json.dumps(request).encode()
    if kind == "mutated" and data:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"", b"}"])) \
            + data[at + draw(st.integers(0, 3)):]
    return data


SEGMENT = st.sampled_from([b"tiny", b"rope", b"%ff", b"%2e%2e", b"..", b"%00", b"\xc3\xa9",
                           b"x" * 300, b"1", b"\xd9\xa3", b"-1"]) \
    | st.binary(max_size=6).map(lambda b: b.replace(b" ", b"").replace(b"\r", b"")
                                .replace(b"\n", b"").replace(b"?", b"").replace(b"#", b""))
HEADER_VALUE = st.sampled_from([b"0", b"3", b"\xc2\xb2", b"\xd9\xa3", b"9" * 40, b"-1",
                                b"\xff\xfe", b"\x01", b"10S", b"1n", b"soon", b""]) \
    | st.binary(max_size=12).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))


@st.composite
def paths(draw: st.DrawFn) -> bytes:
    model = draw(SEGMENT)
    return draw(st.sampled_from([
        b"/v2/models/%s/infer" % model, b"/v2/models/%s/infer" % model,
        b"/v2/models/%s/versions/%s/infer" % (model, draw(SEGMENT)),
        b"/v2/models/%s/tokenize" % model, b"/v2/models/%s" % model,
        b"/v2/models/%s/ready" % model, b"/v2/repository/index", b"/v2", b"/v2/health/ready",
        b"/" + model, b"/v2/%s" % model]))


HEADERS = st.lists(st.tuples(st.sampled_from([b"Inference-Header-Content-Length",
                                              b"grpc-timeout", b"x-request-id",
                                              b"Content-Type", b"traceparent",
                                              b"Authorization", b"Transfer-Encoding"]),
                             HEADER_VALUE), max_size=3)


# -- the property -----------------------------------------------------------------------------


@FUZZ
@given(method=st.sampled_from([b"POST", b"POST", b"GET", b"PUT"]), path=paths(),
       headers=HEADERS, body=bodies())
@example(method=b"POST", path=b"/v2/models/tiny/infer", headers=[], body=b"[" * 100_000)
@example(method=b"POST", path=b"/v2/models/tiny/infer",
         headers=[(b"Inference-Header-Content-Length", b"\xc2\xb2")], body=GOOD)
@example(method=b"POST", path=b"/v2/models/tiny/infer", headers=[],
         body=b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1000], '
              b'"data": [' + b",".join([b'"x"'] * 1000) + b"]}]}")  # over the count
@example(method=b"POST", path=b"/v2/models/tiny/infer", headers=[(b"x-request-id", b"\xff")],
         body=GOOD)
@example(method=b"POST", path=b"/v2/models/tiny/infer", headers=[], body=b"x" * 300_000)
def test_no_rest_input_is_a_5xx_and_its_cost_is_bounded_by_its_bytes(
        fuzz_server: ServerHandle, tracebacks: _Tracebacks, method: bytes, path: bytes,
        headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    port = fuzz_server.http_port
    size = len(path) + sum(len(k) + len(v) for k, v in headers) + len(body)
    bound = SECONDS_FLOOR + size * SECONDS_PER_BYTE
    spent, status, answer = [], 0, b""
    for _ in range(3):  # a real cost repeats; a stall of this loaded machine does not
        before = server_seconds(fuzz_server)
        status, answer = exchange(port, method, path, headers, body)
        spent.append(server_seconds(fuzz_server) - before)
        if spent[-1] <= bound:
            break
    deadline_set = any(k == b"grpc-timeout" for k, _ in headers)
    event(f"HTTP {status}")
    assert status < 500 or (status == 504 and deadline_set), (status, answer[:300])
    assert tracebacks.seen == []
    assert min(spent) <= bound, (spent, size)
    good = exchange(port, b"POST", b"/v2/models/tiny/infer", [], GOOD)
    assert good == GOOD_ANSWER[port]


GOOD_ANSWER: dict[int, tuple[int, bytes]] = {}


@pytest.fixture(scope="module", autouse=True)
def good_answer(fuzz_server: ServerHandle) -> None:
    """The known-good request's answer before any example (binary rows: exact bytes)."""
    answer = exchange(fuzz_server.http_port, b"POST", b"/v2/models/tiny/infer", [], GOOD)
    assert answer[0] == 200
    GOOD_ANSWER[fuzz_server.http_port] = answer
