"""Every ``curl`` command of docs/interop.md's REST section, run with real curl against a
real server (the doc's ``localhost:8000`` and model ``default``, the one ``make run``
serves, become the test server's); and every row of the shared request table
(``tests/vectors/oip_cases.json``) as a curl command: JSON in (raw text bytes with the
binary tensor data extension), JSON out for FP32 and binary out for the 16-bit types."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from tests.oip_cases import CASES, OipCase, Outcome, check
from tests.tiny_model import DIM

DOC = Path(__file__).resolve().parents[4] / "docs" / "interop.md"


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


def table_request(case: OipCase) -> tuple[str, bytes, dict[str, str]]:
    """The row as an infer request: its path, body and headers."""
    r = case.request
    json_out = r.get("parameters", {}).get("datatype", "FP32") == "FP32"
    binary = b""
    if "ids" in r:
        ids = r["ids"]
        tensor: dict[str, Any] = {"name": "input_ids", "datatype": r.get("datatype", "INT64"),
                                  "shape": [len(ids), len(ids[0])], "data": ids}
    else:
        texts = case.texts()
        tensor = {"name": "text", "datatype": "BYTES", "shape": [len(texts)]}
        if all(isinstance(t, str) for t in r["texts"]):
            tensor["data"] = r["texts"]
        else:  # raw bytes: each element's length (uint32 LE), then its bytes
            binary = b"".join(struct.pack("<I", len(t)) + t for t in texts)
            tensor["parameters"] = {"binary_data_size": len(binary)}
    body: dict[str, Any] = {"inputs": [tensor],
                            "parameters": {**r.get("parameters", {}),
                                           **({} if json_out else {"binary_data_output": True})}}
    if "outputs" in r:
        body["outputs"] = [{"name": n, "parameters": {"binary_data": not json_out}}
                           for n in r["outputs"]]
    if "id" in r:
        body["id"] = r["id"]
    head = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **case.headers}
    if binary:
        headers["Inference-Header-Content-Length"] = str(len(head))
    version = f"/versions/{case.version}" if case.version else ""
    return f"/v2/models/{case.model}{version}/infer", head + binary, headers


def table_outcome(port: int, case: OipCase, tmp_path: Path) -> Outcome:
    """One row sent with curl; the status and message, or each output's shape and bytes."""
    if shutil.which("curl") is None:
        pytest.fail("curl missing: run scripts/install_chromium.sh (make test does)")
    path, body, headers = table_request(case)
    (tmp_path / "request").write_bytes(body)
    command = ["curl", "-sS", "--data-binary", "@request", "-o", "response", "-D", "headers",
               "-w", "%{http_code}", f"http://127.0.0.1:{port}{path}"]
    for k, v in headers.items():
        command[1:1] = ["-H", f"{k}: {v}"]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    status = int(proc.stdout)
    answer = (tmp_path / "response").read_bytes()
    if status != 200:
        return Outcome(status, json.loads(answer)["error"])
    got = dict(line.split(": ", 1) for line in
               (tmp_path / "headers").read_text().lower().splitlines()[1:] if ": " in line)
    n = int(got.get("inference-header-content-length", len(answer)))
    header, at = json.loads(answer[:n]), n
    out = Outcome()
    for o in header["outputs"]:
        out.shapes[o["name"]] = o["shape"]
        size = o.get("parameters", {}).get("binary_data_size")
        if size is None:  # JSON: FP32 rows as float32, lengths as int64
            out.data[o["name"]] = np.asarray(
                o["data"], "<f4" if o["datatype"] == "FP32" else "<i8").tobytes()
        else:
            out.data[o["name"]], at = answer[at:at + size], at + size
    assert at == len(answer)
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_table_row(case_servers: dict[str, ServerHandle], case: OipCase,
                   tmp_path: Path) -> None:
    handle = case_servers[case.server]
    check(handle.target, case, table_outcome(handle.http_port, case, tmp_path), http=True)
