"""The REST front against an attacker's bodies and headers, on the suite's guarded server.

- A request refused before its body (no token: 401; a declared length over the limit:
  413) costs nothing more: the connection is closed, and of the 64 MiB the client tries to
  send the server reads only what was in flight (measured: the process's ``rchar`` and
  the server loop thread's CPU time).
- A body is read in time linear in its bytes however it is framed: chunked in 4 KiB
  chunks it costs what the same bytes with a Content-Length cost; a body trickled a byte
  at a time is cut off at the request's deadline with 408.
- No input is a 500: deep nesting, huge numbers, invalid UTF-8, odd headers; each gets
  its 4xx and no traceback is logged.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator

import pytest

from service.local import ServerHandle
from tests.security.conftest import TOKEN
from tests.service.rpc.http.conftest import infer_body, request

HTTP_AUTH = {"Authorization": f"Bearer {TOKEN}"}
INFER = "/v2/models/tiny/infer"
MIB = 1 << 20


def rchar() -> int:
    """Bytes this process has read from descriptors (the server runs in it)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def loop_cpu(handle: ServerHandle) -> float:
    """CPU seconds of the server's event-loop thread."""
    assert handle.thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(handle.thread.ident))


@pytest.fixture
def no_tracebacks(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every record the server logs during the test, checked for a traceback."""
    with caplog.at_level(logging.INFO):
        yield
    traced = [r.getMessage() for r in caplog.records if r.exc_info or r.exc_text]
    assert traced == []


def head(port: int, extra: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST " + INFER.encode() + b" HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n")
    return s


def push(s: socket.socket, total: int) -> int:
    """Send up to ``total`` bytes of body; how many the kernel took before the server
    closed (reset) the connection or the 5 s the test allows passed."""
    block = b"x" * (256 << 10)
    sent = 0
    s.settimeout(5)
    try:
        while sent < total:
            sent += s.send(block)
    except OSError:
        pass
    return sent


@pytest.mark.parametrize(("headers", "status"), [
    (b"Content-Length: 67108864\r\n", 401),  # no token
    (b"Authorization: Bearer %s\r\nContent-Length: 1073741824\r\n" % TOKEN.encode(), 413),
    (b"Transfer-Encoding: chunked\r\n", 401),
])
def test_a_refused_body_is_not_read(guarded: ServerHandle, headers: bytes, status: int) -> None:
    before, cpu = rchar(), loop_cpu(guarded)
    with head(guarded.http_port, headers) as s:
        s.sendall(b"x" * 1024 if b"chunked" not in headers else b"400\r\n" + b"x" * 1024)
        answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 %d " % status), answer
        assert b"Connection: close" in answer
        sent = push(s, 64 * MIB)
    read, spent = rchar() - before, loop_cpu(guarded) - cpu
    # Before: every byte was read and discarded (gigabytes in seconds, up to 10 s).
    assert read < 8 * MIB, (read, sent)
    assert spent < 0.25, spent
    assert request(guarded.http_port, "GET", "/v2/health/live", headers=HTTP_AUTH).status == 200


def _chunked(port: int, body: bytes, chunk: int) -> bytes:
    with head(port, b"Authorization: Bearer %s\r\nTransfer-Encoding: chunked\r\n"
              % TOKEN.encode()) as s:
        framing = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + chunk]), body[i:i + chunk])
                           for i in range(0, len(body), chunk))
        s.sendall(framing + b"0\r\n\r\n")
        return s.recv(65536)


def _sized(port: int, body: bytes) -> bytes:
    with head(port, b"Authorization: Bearer %s\r\nContent-Length: %d\r\n"
              % (TOKEN.encode(), len(body))) as s:
        s.sendall(body)
        return s.recv(65536)


def test_a_body_is_read_in_linear_time_however_framed(guarded: ServerHandle) -> None:
    port = guarded.http_port
    body = b" " * (32 * MIB - 2) + b"[]"  # valid JSON that is not an object: read whole
    costs = {}
    for name, send in (("sized", lambda: _sized(port, body)),
                       ("chunked 4 KiB", lambda: _chunked(port, body, 4096)),
                       ("chunked 4 KiB, quarter", lambda: _chunked(port, body[-8 * MIB:],
                                                                   4096))):
        tries = []
        for _ in range(3):  # the least of 3: a collection or a neighbour adds, never takes
            cpu = loop_cpu(guarded)
            answer = send()
            tries.append(loop_cpu(guarded) - cpu)
            assert answer.startswith(b"HTTP/1.1 400 "), answer
            assert answer.endswith(b'{"error": "request body must be a JSON object"}'), answer
        costs[name] = min(tries)
    # Before: 32 MiB chunked took seconds (the body grew by concatenation, quadratic).
    assert costs["chunked 4 KiB"] < 1.5, costs
    assert costs["chunked 4 KiB"] < 8 * costs["chunked 4 KiB, quarter"] + 0.1, costs


def test_a_body_trickled_byte_by_byte_ends_at_its_deadline_with_408(
        guarded: ServerHandle) -> None:
    with head(guarded.http_port, b"Authorization: Bearer %s\r\nContent-Length: 1000\r\n"
              b"grpc-timeout: 400m\r\n" % TOKEN.encode()) as s:
        t0 = time.monotonic()
        s.settimeout(0.05)
        answer = b""
        while not answer and time.monotonic() - t0 < 5:
            try:
                s.send(b"{")
                answer = s.recv(65536)
            except TimeoutError:
                continue
        elapsed = time.monotonic() - t0
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert answer.endswith(b'"request body not received within 0.4 s (the request\'s '
                           b'grpc-timeout, at most 60 s)"}'), answer
    assert 0.3 < elapsed < 2, elapsed


DEEP = b"[" * 100_000 + b"]" * 100_000
HOSTILE_BODIES: list[tuple[bytes, dict[str, bytes], int, str]] = [
    (DEEP, {}, 400, "request body is not valid JSON: nested deeper than the parser allows"),
    (b'{"inputs": ' + DEEP + b"}", {}, 400, "request body is not valid JSON: nested deeper "
     "than the parser allows"),
    (json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 1],
                             "data": json.loads("[" * 100 + "1" + "]" * 100)}]}).encode(), {}, 400,
     "input 'input_ids': INT64 data must be integers (a flat list, or nested lists of one "
     "shape)"),
    (json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                             "data": [[[[[[[[[[[[["a"]]]]]]]]]]]]]}]}).encode(), {}, 200, ""),
    (b'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 1], "data": [1'
     + b"0" * 4400 + b"]}]}", {}, 400, "request body is not valid JSON: Exceeds the limit "
     "(4300 digits) for integer string conversion: value has 4401 digits; use "
     "sys.set_int_max_str_digits() to increase the limit"),
    (b'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 1], '
     b'"data": [1e999]}]}', {}, 400, "input 'input_ids': INT64 data must be integers (a "
     "flat list, or nested lists of one shape)"),
    (b'{"id": "\xff\xfe"}', {}, 400, "request body is not valid JSON: 'utf-8' codec can't "
     "decode byte 0xff in position 8: invalid start byte"),
    (json.dumps(infer_body([[1]])).encode(), {"Inference-Header-Content-Length": "\u00b2".encode()},
     400, "Inference-Header-Content-Length='\u00b2' must be a non-negative integer (at most "
     "18 ASCII digits)"),
    (json.dumps(infer_body([[1]])).encode(), {"Inference-Header-Content-Length": "\u0663".encode()},
     400, "Inference-Header-Content-Length='\u0663' must be a non-negative integer (at most "
     "18 ASCII digits)"),
    (json.dumps(infer_body([[1]])).encode(), {"Inference-Header-Content-Length": b"9" * 5000},
     400, "Inference-Header-Content-Length='" + "9" * 64 + "'... (5000 characters) must be a "
     "non-negative integer (at most 18 ASCII digits)"),
    (json.dumps(infer_body([[1]])).encode(), {"grpc-timeout": "\u0663S".encode()}, 400,
     "grpc-timeout='\u0663S' must be 1-8 digits and a unit (H, M, S, m, u, n), e.g. '250m'"),
]


@pytest.mark.parametrize(("body", "headers", "status", "message"), HOSTILE_BODIES,
                         ids=[f"case{i}" for i in range(len(HOSTILE_BODIES))])
def test_no_body_or_header_is_a_500(guarded: ServerHandle, no_tracebacks: None, body: bytes,
                                    headers: dict[str, bytes], status: int,
                                    message: str) -> None:
    reply = request(guarded.http_port, "POST", INFER, body,
                    {**HTTP_AUTH, **headers})  # type: ignore[dict-item]
    assert reply.status == status, reply.body
    if message:
        assert reply.json() == {"error": message}
    assert request(guarded.http_port, "POST", INFER, infer_body([[1, 2]]),
                   HTTP_AUTH).status == 200


def test_raw_header_bytes_are_never_a_500(guarded: ServerHandle, no_tracebacks: None) -> None:
    """Header values the client library would not send: invalid UTF-8, control bytes."""
    body = json.dumps(infer_body([[1]])).encode()
    for extra in (b"x-request-id: \xff\xfe\x80\r\n", b"x-request-id: a\x01b\r\n",
                  b"Inference-Header-Content-Length: \xd9\xa3\r\n",
                  b"grpc-timeout: \xff\r\n", b"traceparent: \xff\xff\r\n",
                  b"Authorization: Bearer \xff\r\n"):
        with head(guarded.http_port, extra + b"Authorization: Bearer %s\r\nContent-Length: "
                  b"%d\r\n" % (TOKEN.encode(), len(body))) as s:
            s.sendall(body)
            answer = s.recv(65536)
        code = int(answer.split(b" ", 2)[1])
        assert 200 <= code < 500, (extra, answer)


def test_a_client_still_sending_reads_its_refusal(guarded: ServerHandle) -> None:
    """The refused connection is half-closed and left unread for ``LINGER_SECONDS``
    before its close: a client that sends its whole (moderate) body before reading still
    finds the 413 (closing at once over unread bytes resets the connection, and the
    reset discards the answer on the client's side)."""
    with head(guarded.http_port, b"Authorization: Bearer %s\r\nContent-Length: 1073741824"
              b"\r\n" % TOKEN.encode()) as s:
        time.sleep(0.1)  # refused from its headers by now
        s.sendall(b"x" * MIB)
        answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413 "), answer
    assert answer.endswith(b'{"error": "request body is 1073741824 bytes; max_message_bytes '
                           b'is 67108864"}'), answer
