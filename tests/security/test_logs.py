"""Item 6 (logs): a client cannot forge a log line.

A request id (or any client text that reaches a log record or an exception message) with a
newline or a terminal escape stays inside its own record: text logs escape control
characters in the message and prefix every traceback line with "  | "; JSON logs are one
object per line. Checked on the records a real server writes for a request whose
request_id carries a forged line.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable, Iterator

import grpc
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from service.logs import escape_controls, formatter
from tests.security.conftest import AUTH, still_serves

FORGED = "2026-01-01 00:00:00,000 ERROR service.frame: forged"
HOSTILE_ID = f"r1\n{FORGED}\r\x1b[2J\u2028x"
RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")


@pytest.fixture(params=["text", "json"])
def server_log(request: pytest.FixtureRequest) -> Iterator[tuple[str, io.StringIO]]:
    """What the server's loggers write, in the given ``--log-format``."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter(request.param))
    root = logging.getLogger("service")
    root.addHandler(handler)
    try:
        yield request.param, out
    finally:
        root.removeHandler(handler)


def test_a_request_id_cannot_forge_a_line(guarded: ServerHandle,
                                          native: pb_grpc.EmbeddingServiceStub,
                                          server_log: tuple[str, io.StringIO],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """An INTERNAL error logs the request id (and the exception, whose message here
    carries client text too): still one record, no forged line."""
    log_format, out = server_log
    tokenizer = guarded.server.repo.get("tiny", 0).tokenizer

    def boom(text: str, *args: object) -> list[int]:
        raise RuntimeError(f"cannot tokenize {text}")  # client text in the exception

    monkeypatch.setattr(tokenizer, "encode", boom)
    with pytest.raises(grpc.RpcError) as info:
        native.Embed(pb.EmbedRequest(text=f"x\n{FORGED}", request_id=HOSTILE_ID),
                     metadata=AUTH, timeout=10)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "\n" not in info.value.details()
    monkeypatch.undo()
    lines = out.getvalue().splitlines()
    assert lines, "the server logged nothing"
    if log_format == "json":
        records = [json.loads(line) for line in lines]  # every line is a whole record
        assert any("request_id='r1\\n2026-01-01" in r["message"] for r in records), records
    else:
        starts = [line for line in lines if RECORD_START.match(line)]
        assert len(starts) == 1, lines  # the one record; its traceback lines start "  | "
        assert all(line.startswith("  | ") for line in lines[1:]), lines
        assert not any(line.startswith(FORGED) for line in lines)
        assert "\x1b" not in out.getvalue()
        assert "\u2028" not in out.getvalue()
    still_serves(native)


@pytest.mark.parametrize(("raw", "escaped"), [
    ("a\nb", "a\\nb"), ("a\rb", "a\\rb"), ("\x1b[31m", "\\x1b[31m"), ("\x00", "\\x00"),
    ("\x85", "\\x85"), ("a\u2028b\u2029", "a\\u2028b\\u2029"), ("é ok\t", "é ok\\t"),
])
def test_escape_controls(raw: str, escaped: str) -> None:
    assert escape_controls(raw) == escaped


def test_text_records_escape_their_arguments() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter("text"))
    log = logging.getLogger("tests.security.logs")
    log.addHandler(handler)
    log.propagate = False
    emit: Callable[..., None] = log.warning
    try:
        emit("refused request_id=%s model=%r", "a\nFORGED b", "m\r\n")
    finally:
        log.removeHandler(handler)
    (line,) = out.getvalue().splitlines()
    assert line.endswith("refused request_id=a\\nFORGED b model='m\\r\\n'")
