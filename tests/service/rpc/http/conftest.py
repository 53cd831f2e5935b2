"""Plain HTTP against real servers: one request, its status, headers and body."""

from __future__ import annotations

import http.client
import json
import ssl
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.service.rpc.http.page_browser import browser  # noqa: F401  (the page tests' fixture)
from tests.tiny_model import DIM

__all__ = ["TINY_METADATA", "Reply", "as_bits", "binary_outputs", "infer_body", "request"]

# GET /v2/models/tiny: what every REST peer must read of the tiny model.
TINY_METADATA = {
    "name": "tiny", "versions": ["1"], "platform": "embedding",
    "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
               {"name": "text", "datatype": "BYTES", "shape": [-1]}],
    "outputs": [{"name": "embeddings", "datatype": "FP32", "shape": [-1, -1, DIM]},
                {"name": "sequence_lengths", "datatype": "INT64", "shape": [-1]}],
    "parameters": {"family": "", "rules": "none", "tokenizer": "tiktoken:tokenizer.tiktoken",
                   "hidden_size": DIM}}


@dataclass
class Reply:
    """An HTTP response, read whole."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


def request(port: int, method: str, path: str, body: bytes | dict[str, Any] | None = None,
            headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None,
            timeout: float = 30) -> Reply:
    """One request on a fresh connection (http.client: nothing between us and the wire)."""
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=timeout)
        if context is not None else http.client.HTTPConnection("127.0.0.1", port,
                                                               timeout=timeout))
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()},
                     response.read())
    finally:
        conn.close()


def infer_body(ids: list[list[int]] | None = None, texts: list[str] | None = None,
               **parameters: Any) -> dict[str, Any]:
    """A JSON infer request with ``input_ids`` [B, T] or ``text`` [B]."""
    if ids is not None:
        tensor = {"name": "input_ids", "datatype": "INT64", "shape": [len(ids), len(ids[0])],
                  "data": ids}
    else:
        assert texts is not None
        tensor = {"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}
    return {"inputs": [tensor], "parameters": parameters}


def binary_outputs(reply: Reply) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The JSON header of a binary response and each binary output's bytes, by name."""
    assert reply.status == 200, reply.body
    n = int(reply.headers["inference-header-content-length"])
    header = json.loads(reply.body[:n])
    out, at = {}, n
    for o in header["outputs"]:
        size = o.get("parameters", {}).get("binary_data_size")
        if size is not None:
            out[o["name"]] = reply.body[at:at + size]
            at += size
    assert at == len(reply.body)
    return header, out


def as_bits(data: list[float]) -> bytes:
    """JSON FP32 numbers as the little-endian float32 bytes they stand for."""
    return np.asarray(data, dtype="<f4").tobytes()
