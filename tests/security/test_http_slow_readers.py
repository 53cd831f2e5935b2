"""REST clients that send a request for a large answer and never read it.

An answer counts against the limits until its last byte has left: the in-flight cap
(``--max-concurrent-rpcs``) and the unsent-answer budget every front shares
(``--max-unsent-bytes``). Before, the slot was given back when the handler returned, before
the body was sent: sixteen never-reading clients under a cap of four were all answered and
the server held every answer (and a copy of each joined to its headers).
"""

from __future__ import annotations

import json
import re
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from service.rpc.http import HttpFront
from tests.security.conftest import TOKEN, WIDE_DIM
from tests.service.rpc.http.conftest import infer_body, request
from tests.tiny_model import MAX_SEQ_LEN, start

HTTP_AUTH = {"Authorization": f"Bearer {TOKEN}"}
B = 512  # x 64 tokens x 128 x 4 B: a 16 MiB answer, far past what loopback buffers take
ROWS = B * MAX_SEQ_LEN * WIDE_DIM * 4
BOUND = ROWS + 24 * B * 2 + 4096  # what a request reserves first (RestReply.prepare)
BIG_LIMITS = {"auth_token": TOKEN, "max_inputs_per_request": B,
              "max_tokens_per_request": B * MAX_SEQ_LEN}


def big_body(binary: bool = True, b: int = B) -> bytes:
    ids = np.random.default_rng(0).integers(0, 50257, (b, MAX_SEQ_LEN)).tolist()
    return json.dumps({**infer_body(ids), "parameters": {"binary_data_output": binary}}).encode()


def answer_length(port: int, body: bytes) -> int:
    """The length of ``body``'s answer, read at once: what an unread one holds of the
    budget once it is built (``RestHold.settle``), below the bound it reserved first."""
    answer = request(port, "POST", "/v2/models/wide/infer", body, HTTP_AUTH)
    assert answer.status == 200
    return len(answer.body)


def slow_client(port: int, body: bytes) -> socket.socket:
    """Sends the request and reads nothing (a 4 KiB receive buffer: the kernel takes
    almost nothing on the client's behalf)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(30)
    s.connect(("127.0.0.1", port))
    s.sendall(b"POST /v2/models/wide/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
              + TOKEN.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    return s


def read_reply(s: socket.socket) -> tuple[int, bytes]:
    """(status, body) of one HTTP/1.1 response with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    match = re.search(rb"(?im)^content-length: (\d+)", head)
    assert match is not None, head
    length = int(match.group(1))
    chunks = [rest]
    got = len(rest)
    while got < length:
        chunk = s.recv(1 << 20)
        assert chunk, "closed early"
        chunks.append(chunk)
        got += len(chunk)
    return int(head.split(b" ", 2)[1]), b"".join(chunks)


def wait_for(what: Callable[[], bool], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def read_at_last(slow: list[socket.socket], http: HttpFront, body: bytes) -> None:
    """The unread answers, read at last, are whole and exact (a fresh request's bytes), and
    once they are taken the server holds no slot and no budget for them."""
    answers = [read_reply(s) for s in slow]
    for s in slow:
        s.close()
    wait_for(lambda: http.slots.inflight == 0 and http.budgets.held == 0)
    again = request(http.port, "POST", "/v2/models/wide/infer", body, HTTP_AUTH)
    assert again.status == 200
    assert answers == [(200, again.body)] * len(slow)  # late, and exact


def budget_full(budget: int, held: int) -> bytes:
    """The 429 body of a large request while unread answers hold ``held`` bytes."""
    return json.dumps({
        "error": f"answers not yet taken by their clients hold {held} bytes; this "
                 f"one's {BOUND} would pass max_unsent_bytes={budget}; retry later"}).encode()


def test_unread_answers_hold_their_in_flight_slot(security_repo: Path) -> None:
    handle = start(security_repo, max_concurrent_rpcs=2, max_unsent_bytes=0, **BIG_LIMITS)
    try:
        port, http = handle.http_port, handle.server.http
        assert http is not None
        body = big_body()
        answer = answer_length(port, body)
        assert answer < BOUND
        slow = [slow_client(port, body) for _ in range(2)]
        wait_for(lambda: http.slots.inflight == 2 and http.budgets.held == 2 * answer)
        time.sleep(0.3)  # still held: nobody reads
        assert http.slots.inflight == 2
        refused = request(port, "POST", "/v2/models/tiny/infer", infer_body([[1]]), HTTP_AUTH)
        assert (refused.status, refused.json()) == (429, {
            "error": "2 HTTP requests in flight: max_concurrent_rpcs=2; retry later"})
        read_at_last(slow, http, body)
    finally:
        handle.stop()


def test_unread_answers_are_bounded_by_the_unsent_budget(security_repo: Path) -> None:
    """Two 16 MiB answers unread fill a 40 MiB budget: a third large one is refused
    (429 naming the flag) before its output is allocated, a small one is served at its
    usual latency, and what the server holds stays the two answers (its
    memory, in a server process of its own, is measured by ``bench.overload``)."""
    budget = 40 << 20
    handle = start(security_repo, max_concurrent_rpcs=8, max_unsent_bytes=budget,
                   **BIG_LIMITS)
    try:
        port, http = handle.http_port, handle.server.http
        assert http is not None
        body = big_body()
        baseline = [request(port, "POST", "/v2/models/tiny/infer", infer_body([[1, 2]]),
                            HTTP_AUTH) for _ in range(3)]  # warm
        assert all(r.status == 200 for r in baseline)
        answer = answer_length(port, body)
        slow = [slow_client(port, body) for _ in range(2)]
        wait_for(lambda: http.budgets.held == 2 * answer)
        third = slow_client(port, body)
        assert read_reply(third) == (429, budget_full(budget, 2 * answer))
        third.close()
        latencies = []
        for _ in range(10):
            t0 = time.perf_counter()
            ok = request(port, "POST", "/v2/models/tiny/infer", infer_body([[1, 2]]),
                         HTTP_AUTH)
            latencies.append(time.perf_counter() - t0)
            assert ok.status == 200
        print(f"2 unread answers of {ROWS} B held; ordinary client median "
              f"{statistics.median(latencies) * 1e3:.1f} ms")
        assert statistics.median(latencies) < 0.5, latencies
        wait_for(lambda: http.budgets.held == 2 * answer)  # the last small one given back
        read_at_last(slow, http, body)
    finally:
        handle.stop()


def test_requests_waiting_for_budget_leave_their_slot_to_ordinary_clients(
        security_repo: Path) -> None:
    """Two unread answers fill the budget; four more large requests wait for room, and
    they wait without their in-flight slots: under a cap of four an ordinary client is
    served while they wait (it was refused 429 while they held the slots), a seventh large
    request finds as many waiting as may be in flight and is refused at once, and each
    waiter is refused naming the budget once its wait is over."""
    budget = 40 << 20
    handle = start(security_repo, max_concurrent_rpcs=4, max_unsent_bytes=budget,
                   **BIG_LIMITS)
    try:
        port, http = handle.http_port, handle.server.http
        assert http is not None
        http.slots.wait_s = 4.0  # room for the checks below on a loaded machine
        body = big_body()
        answer = answer_length(port, body)
        slow = [slow_client(port, body) for _ in range(2)]
        wait_for(lambda: http.budgets.held == 2 * answer)
        waiting = []
        for k in range(1, 5):  # one at a time: each holds a slot while its body is read
            waiting.append(slow_client(port, body))
            wait_for(lambda: http.slots.waiting == k)  # noqa: B023 (k is read at once)
        assert http.slots.inflight == 2  # the two unread answers; no waiter holds a slot
        ordinary = request(port, "POST", "/v2/models/tiny/infer", infer_body([[1, 2]]),
                           HTTP_AUTH)
        assert ordinary.status == 200
        full = budget_full(budget, 2 * answer)
        t0 = time.monotonic()
        seventh = slow_client(port, body)
        assert read_reply(seventh) == (429, full)
        assert time.monotonic() - t0 < 2.0  # not after a wait of its own
        assert http.slots.waiting == 4
        seventh.close()
        for s in waiting:
            assert read_reply(s) == (429, full)
            s.close()
        assert (http.slots.waiting, http.slots.inflight) == (0, 2)
        read_at_last(slow, http, body)
    finally:
        handle.stop()


def test_an_unread_json_answer_holds_its_own_length_not_its_bound(security_repo: Path) -> None:
    """A JSON answer's size is bounded before its numbers are printed (25 characters a
    value); once printed, an unread one holds what it is: another that fits beside it in
    what is left of the budget is served."""
    b = 32  # x 64 tokens x 128 values: 262,144 numbers, about 5 MB of JSON
    bound = b * MAX_SEQ_LEN * WIDE_DIM * 25 + 24 * b * 2 + 4096
    handle = start(security_repo, max_concurrent_rpcs=8, max_unsent_bytes=2 * bound - 1,
                   **BIG_LIMITS)
    try:
        port, http = handle.http_port, handle.server.http
        assert http is not None
        body = big_body(binary=False, b=b)
        answer = answer_length(port, body)
        assert answer < bound - 1 << 20  # the widths are under the bound by megabytes
        slow = slow_client(port, body)
        wait_for(lambda: http.budgets.held == answer)
        second = slow_client(port, body)  # reserves its bound beside the first's length
        wait_for(lambda: http.budgets.held == 2 * answer)
        read_at_last([slow, second], http, body)
    finally:
        handle.stop()
