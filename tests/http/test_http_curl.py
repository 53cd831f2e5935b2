"""Every ``curl`` command of docs/interop.md's REST section, run with real curl against a
real server (the doc's ``localhost:8000`` and model ``default``, the one ``make run``
serves, become the test server's)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from tests.tiny_model import DIM

DOC = Path(__file__).resolve().parents[2] / "docs" / "interop.md"


def blocks() -> list[str]:
    """The doc's ```bash curl blocks, in order."""
    return re.findall(r"```bash curl\n(.*?)```", DOC.read_text(), re.S)


def run(block: str, port: int, cwd: Path) -> str:
    if shutil.which("curl") is None:
        pytest.fail("curl missing: run scripts/install_chromium.sh (make test does)")
    script = block.replace("localhost:8000", f"127.0.0.1:{port}").replace(
        "/models/default/", "/models/tiny/").replace("/models/default\n", "/models/tiny\n")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, (script, proc.stderr)
    return proc.stdout


def test_the_doc_has_the_commands_this_test_knows() -> None:
    assert len(blocks()) == 4


def test_health_and_metadata(server: ServerHandle, tmp_path: Path) -> None:
    printed = run(blocks()[0], server.http_port, tmp_path)
    ready, end = json.JSONDecoder().raw_decode(printed)  # two bodies, no newline between
    assert ready == {"ready": True}
    meta = json.loads(printed[end:])
    assert (meta["name"], meta["outputs"][0]) == (
        "tiny", {"name": "embeddings", "datatype": "FP32", "shape": [-1, -1, DIM]})


def test_json_infer_equals_native(server: ServerHandle, tmp_path: Path) -> None:
    out = json.loads(run(blocks()[1], server.http_port, tmp_path))
    with grpc.insecure_channel(server.target) as channel:
        native = pb_grpc.EmbeddingServiceStub(channel).Embed(pb.EmbedRequest(
            model="tiny", token_ids=pb.TokenIds(ids=[464, 3797, 11114, 284, 262]),
            compose=pb.COMPOSE_TOKEN_ONLY, start_position=7))
    embeddings = out["outputs"][0]
    assert embeddings["shape"] == [1, 5, DIM]
    assert np.asarray(embeddings["data"], "<f4").tobytes() == native.embeddings.data
    assert out["parameters"]["start_position"] == 7


def test_text_binary_bf16(server: ServerHandle, tmp_path: Path) -> None:
    printed = run(blocks()[2], server.http_port, tmp_path)
    n = int(printed.split(":")[1])
    body = (tmp_path / "response.bin").read_bytes()
    header = json.loads(body[:n])
    assert header["outputs"][0]["datatype"] == "BF16"
    assert header["outputs"][0]["shape"] == [1, 2, DIM]
    size = header["outputs"][0]["parameters"]["binary_data_size"]
    with grpc.insecure_channel(server.target) as channel:
        native = pb_grpc.EmbeddingServiceStub(channel).Embed(pb.EmbedRequest(
            model="tiny", text="hello world", dtype=pb.DTYPE_BFLOAT16))
    assert body[n:n + size] == native.embeddings.data


def test_refusal(server: ServerHandle, tmp_path: Path) -> None:
    printed = run(blocks()[3], server.http_port, tmp_path)
    assert printed == ('{"error": "input_ids[0][1]=50257 is out of range [0, 50257) for model '
                       '\'tiny\'"}400\n')
    doc = DOC.read_text()
    assert ("prints `{\"error\": \"input_ids[0][1]=50257 is out of range [0, 50257) for "
            "model 'default'\"}400`") in doc
