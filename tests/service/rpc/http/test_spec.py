"""The REST front against the Open Inference Protocol's own OpenAPI file (``oip_spec/``).

schemathesis generates requests from the spec, positive (bodies and paths that fit its
schemas) and negative (that break them), and holds every answer of a real server to three
of its checks: no server error (5xx), the content type the spec gives for that status, and
a body valid against the spec's schema for it. Two runs over every operation: one with the
path parameters fixed to the served model and version, so the infer bodies are explored
deeply, and one with them free. In the fixed run a share of the infer bodies carry the
served model's own inputs, as its metadata (GET of the model) names them, with ids and
texts drawn around the limits, so that answered inferences (200) are checked against the
spec as well as refusals. After each run a valid infer is answered with the same bytes
as before it.

``HYPOTHESIS_PROFILE`` sets the budget, as for the other fuzz targets: ``ci`` (default;
derandomized, the same requests every run) and ``long`` (``make fuzz``).
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

from service.local import ServerHandle
from tests.service.rpc.fuzz_strategies import FUZZ
from tests.service.rpc.http.conftest import request
from tests.tiny_model import MAX_SEQ_LEN, VOCAB_SIZE, start

SPEC = Path(__file__).with_name("oip_spec") / "open_inference_rest.yaml"
SCHEMA = schemathesis.openapi.from_path(SPEC)
CHECKS = [not_a_server_error, content_type_conformance, response_schema_conformance]
SERVED = {"MODEL_NAME": "tiny", "MODEL_VERSION": "1"}
INFER = "POST /v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}/infer"
GOOD = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [2, 3],
                    "data": [[31373, 995, 0], [1, 2, 50256]]}]}
# Examples per run at the ci profile's budget (FUZZ.max_examples = 100); ``long`` scales
# them all. The fixed paths get the most: their bodies are where the front's work is.
EXAMPLES = {("served", GenerationMode.POSITIVE): 200, ("served", GenerationMode.NEGATIVE): 120,
            ("free", GenerationMode.POSITIVE): 100, ("free", GenerationMode.NEGATIVE): 60}
HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


@pytest.fixture(scope="module")
def spec_server(tiny_repo: Path) -> Iterator[ServerHandle]:
    handle = start(tiny_repo)
    yield handle
    handle.stop()


def good_infer(port: int) -> bytes:
    """The answer to a valid infer, whole (status checked)."""
    reply = request(port, "POST", "/v2/models/tiny/versions/1/infer", GOOD)
    assert (reply.status, reply.headers["content-type"]) == (200, "application/json"), reply
    return reply.body


def tensor_values(tensor: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A tensor the metadata describes (``datatype``, ``shape`` with -1 for any size), its
    data drawn around the model's limits: ids in and just outside the vocabulary, up to a
    little past max_seq_len; texts of any Unicode."""
    rank = len(tensor["shape"])
    if tensor["datatype"] == "BYTES":
        item: st.SearchStrategy[Any] = st.text(max_size=24)
    else:
        item = st.integers(0, VOCAB_SIZE - 1) | st.sampled_from([-1, VOCAB_SIZE])
    sizes = st.lists(st.integers(1, 3), min_size=rank - 1, max_size=rank - 1)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        outer = draw(sizes)
        inner = draw(st.integers(1, MAX_SEQ_LEN + 2) if rank > 1 else st.integers(1, 3))
        shape = [*outer, inner] if rank > 1 else [inner]
        count = 1
        for n in shape:
            count *= n
        flat = draw(st.lists(item, min_size=count, max_size=count))
        data: Any = flat
        if rank == 2 and draw(st.booleans()):  # nested, row-major, as the spec allows
            data = [flat[i * inner:(i + 1) * inner] for i in range(outer[0])]
        return {"name": tensor["name"], "datatype": tensor["datatype"], "shape": shape,
                "data": data}

    return build()


def served_body(metadata: dict[str, Any], generated: Any) -> st.SearchStrategy[dict[str, Any]]:
    """The generated body with its inputs, outputs and parameters replaced by the served
    model's (from its metadata): the request id stays as schemathesis made it."""
    outputs = st.lists(st.sampled_from([o["name"] for o in metadata["outputs"]]),
                       unique=True).map(lambda names: [{"name": n} for n in names])

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        body: dict[str, Any] = {"inputs": [draw(st.one_of(
            [tensor_values(t) for t in metadata["inputs"]]))]}
        if isinstance(generated, dict) and isinstance(generated.get("id"), str):
            body["id"] = generated["id"]
        if draw(st.booleans()):
            body["outputs"] = draw(outputs)
        return body

    return build()


def strategy(paths: str, mode: GenerationMode) -> st.SearchStrategy[Case]:
    """Cases over every operation of the spec (path parameters fixed or free)."""
    operations = [result.ok() for result in SCHEMA.get_all_operations()
                  if isinstance(result, Ok)]
    assert len(operations) == 6  # every operation the spec has: none failed to load
    return st.one_of([op.as_strategy(
        generation_mode=mode,
        path_parameters=SERVED if paths == "served" and op.path_parameters else None)
        for op in operations])


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                         ids=str)
@pytest.mark.parametrize("paths", ["served", "free"])
def test_answers_conform_to_the_spec(spec_server: ServerHandle, paths: str,
                                     mode: GenerationMode) -> None:
    port = spec_server.http_port
    base = f"http://127.0.0.1:{port}"
    metadata = request(port, "GET", "/v2/models/tiny/versions/1").json()
    before = good_infer(port)
    seen: Counter[tuple[str, int]] = Counter()
    rewrite = paths == "served" and mode is GenerationMode.POSITIVE
    examples = EXAMPLES[paths, mode] * FUZZ.max_examples // 100

    with requests.Session() as session:
        @settings(FUZZ, max_examples=examples, suppress_health_check=HEALTH)
        @given(case=strategy(paths, mode), data=st.data())
        def run(case: Case, data: st.DataObject) -> None:
            if rewrite and case.operation.label == INFER and data.draw(st.booleans()):
                case.body = data.draw(served_body(metadata, case.body))
            response = case.call(base_url=base, session=session, timeout=30)
            seen[case.operation.label, response.status_code] += 1
            case.validate_response(response, checks=CHECKS)

        run()

    assert good_infer(port) == before
    assert seen[INFER, 400] > 0, seen  # refusals, in every run
    if rewrite:  # and answers: the 200 bodies were held to the spec's schema too
        assert seen[INFER, 200] > 0, seen


# -- the checks catch what they claim: a stand-in server that breaks the spec -------------

class _Broken(BaseHTTPRequestHandler):
    """Infer: a 500; server metadata: 200 as text/plain; model metadata: 200 JSON missing
    the required ``platform``."""

    def _answer(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v2/":
            self._answer(200, "text/plain", b"embedding-service")
        else:
            self._answer(200, "application/json", json.dumps({"name": "tiny"}).encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(500, "application/json", b'{"error": "boom"}')

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def broken() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Broken)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize(("path", "method", "body", "failure"), [
    ("/v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}/infer", "POST", GOOD, "ServerError"),
    ("/v2/", "GET", None, "UndefinedContentType"),
    ("/v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}", "GET", None, "JsonSchemaError"),
])
def test_each_check_fails_a_server_that_breaks_the_spec(
        broken: str, path: str, method: str, body: dict[str, Any] | None,
        failure: str) -> None:
    operation = SCHEMA[path][method]
    fields: dict[str, Any] = {"body": body} if body is not None else {}
    case = operation.Case(path_parameters=SERVED if "{" in path else None, **fields)
    with pytest.raises(FailureGroup) as info:
        case.validate_response(case.call(base_url=broken, timeout=10), checks=CHECKS)
    assert [type(f).__name__ for f in info.value.exceptions] == [failure]
