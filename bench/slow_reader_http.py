"""REST slow readers: clients that send an infer request for a large answer and never read.

One phase of ``bench.overload`` (its REST slow-reader row), on a server of its own with
``--http-port``: ``clients`` connections each send one binary-output request of B x T
tokens (a 4 KiB receive buffer, nothing read), while one ordinary REST client runs
closed-loop requests beside them. Sampled every 50 ms: the server's RSS. Afterwards every
slow client reads what it was sent: answered (200, the full body) or refused (429: the
in-flight cap or the unsent-answer budget was spent). Reported: RSS before and at its
peak, the bound the flags set (answers held <= min(--max-concurrent-rpcs, what fits
--max-unsent-bytes) x one answer), and the ordinary client's p50/p99 and statuses.

Before answers were held until their last byte, the slot was given back when the handler
returned: sixteen such clients under a cap of four were all answered, each answer held
twice (joined to its headers) and the server grew past 400 MB against a bound of ~220.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from typing import Any

import aiohttp

from bench.slow_reader import peak_rss_mib, rss_mib
from bench.window import percentile

__all__ = ["format_rest_row", "infer_body", "run_rest_slow_readers"]


def infer_body(ids: list[list[int]]) -> bytes:
    """A JSON infer request with binary output (the answer's rows as raw bytes)."""
    return json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64",
                                   "shape": [len(ids), len(ids[0])], "data": ids}],
                       "parameters": {"binary_data_output": True}}).encode()


def _slow_client(port: int, path: str, body: bytes) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
              .encode() + body)
    return s


def _read_reply(s: socket.socket) -> tuple[int, int]:
    """(status, body bytes) of the one response on ``s``."""
    s.settimeout(60)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(1 << 16)
        if not chunk:
            return 0, 0
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    match = re.search(rb"(?im)^content-length: (\d+)", head)
    length, got = (int(match.group(1)) if match else 0), len(rest)
    while got < length:
        chunk = s.recv(1 << 20)
        if not chunk:
            break
        got += len(chunk)
    return int(head.split(b" ", 2)[1]), got


async def run_rest_slow_readers(port: int, pid: int, model: str, slow_body: bytes,
                                normal: list[bytes], clients: int = 16,
                                seconds: float = 4.0) -> dict[str, Any]:
    """The phase: ``clients`` slow connections plus one ordinary client; figures."""
    path = f"/v2/models/{model}/infer"
    rss_before = rss_mib(pid)
    slow = [_slow_client(port, path, slow_body) for _ in range(clients)]
    latencies: list[float] = []
    codes: dict[int, int] = {}
    end = time.perf_counter() + seconds
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:

        async def loop() -> None:
            i = 0
            while (sent := time.perf_counter()) < end:
                async with session.post(path, data=normal[i % len(normal)]) as reply:
                    await reply.read()
                    codes[reply.status] = codes.get(reply.status, 0) + 1
                    if reply.status == 200:
                        latencies.append((time.perf_counter() - sent) * 1e3)
                i += 1

        sampler = asyncio.ensure_future(peak_rss_mib(pid, end, rss_before))
        await loop()
        peak = await sampler
    replies = [_read_reply(s) for s in slow]
    for s in slow:
        s.close()
    answered = [n for status, n in replies if status == 200]
    return {"clients": clients, "seconds": seconds, "rss_before_mib": rss_before,
            "rss_peak_mib": peak, "rss_growth_mib": peak - rss_before,
            "slow_answered": len(answered),
            "slow_refused": sum(1 for status, _ in replies if status == 429),
            "slow_other": sum(1 for status, _ in replies if status not in (200, 429)),
            "slow_answer_bytes": max(answered, default=0),
            "normal_requests": len(latencies), "normal_req_s": len(latencies) / seconds,
            "normal_p50_ms": percentile(latencies, 0.5),
            "normal_p99_ms": percentile(latencies, 0.99),
            "normal_codes": {str(k): v for k, v in sorted(codes.items())}}


def format_rest_row(phase: dict[str, Any], answer_mib: float, bound_mib: float) -> str:
    """One line: the REST slow readers, what the server held, the ordinary client."""
    return (f"REST slow readers: {phase['clients']} clients ({answer_mib:.0f} MiB answers), "
            f"never read: server RSS {phase['rss_before_mib']:.0f} -> peak "
            f"{phase['rss_peak_mib']:.0f} MiB (+{phase['rss_growth_mib']:.0f}; answers the "
            f"flags allow: {bound_mib:.0f} MiB); {phase['slow_answered']} answered in full "
            f"once read, {phase['slow_refused']} refused (429), {phase['slow_other']} other; "
            f"ordinary client beside them: p50 {phase['normal_p50_ms']:.2f} ms, p99 "
            f"{phase['normal_p99_ms']:.2f} ms, {phase['normal_req_s']:.0f} req/s, statuses "
            f"{phase['normal_codes']}")
