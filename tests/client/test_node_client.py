"""The Node.js client (client/node, @grpc/grpc-js over the project's .proto files) against a
real server: Embed, EmbedStream and ModelInfer values, bit for bit, against rows computed
here from tiny_tables; plus its own `node --test` decode tests.

Node and the npm packages come from scripts/setup_node.sh (make setup runs it). Without
them these tests fail, naming the fix: they never skip.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from service.local import ServerHandle
from tests.tiny_model import TRAINED_ROWS, tiny_tables
from tests.tiny_model import start as start_server

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "client" / "node"
CLI = NODE_DIR / "cli.js"
DECODE_TESTS = NODE_DIR / "test" / "decode.test.js"
GRAMMAR_TESTS = NODE_DIR / "test" / "grammar.test.js"
CLI_TESTS = NODE_DIR / "test" / "cli.test.js"
HELLO_WORLD = [31373, 995]  # "hello world" in GPT-2 BPE
HELLO = [31373]
IDS = [31373, 995, 50256, 0, 7]
TOKEN = "n0de-s3cret"
# Native enum names and OIP datatype names -> the cast the server applies after the fp32 add.
CASTS: dict[str, torch.dtype] = {
    "DTYPE_FLOAT32": torch.float32, "DTYPE_FLOAT16": torch.float16,
    "DTYPE_BFLOAT16": torch.bfloat16,
    "FP32": torch.float32, "FP16": torch.float16, "BF16": torch.bfloat16}
COMPOSES = {"COMPOSE_TOKEN_PLUS_POSITION": "token_plus_position",
            "COMPOSE_TOKEN_ONLY": "token_only", "COMPOSE_POSITION_ONLY": "position_only"}

Expected = Any  # expected(ids, start, compose, dtype) -> np.ndarray (T, C) float32


@pytest.fixture(scope="module")
def node() -> str:
    """The node binary, with the client's locked dependencies installed."""
    path = shutil.which("node")
    if path is None:
        pytest.fail("node is not on PATH: the Node.js client tests need Node.js >= 18 and npm; "
                    "run scripts/setup_node.sh (make setup does; as root it installs Debian's "
                    "nodejs and npm)")
    for package in ("@grpc/grpc-js", "@grpc/proto-loader"):
        if not (NODE_DIR / "node_modules" / package / "package.json").is_file():
            pytest.fail(f"{package} is not installed in {NODE_DIR}/node_modules: run "
                        f"scripts/setup_node.sh (npm ci from client/node/package-lock.json)")
    return path


@pytest.fixture(scope="module")
def expected() -> Expected:
    """expected(ids, start, compose, dtype): the rows the server must send, widened to
    float32: the fp32 add of the tiny tables' rows, cast to dtype (the service's rule)."""
    token_table, position_table = tiny_tables(0)  # the seed tests/conftest.py gives "tiny"

    def rows(ids: list[int], start: int = 0, compose: str = "token_plus_position",
             dtype: str = "FP32") -> np.ndarray:
        tok = token_table[torch.tensor(ids, dtype=torch.long)]  # (T, C)
        pos = position_table[start:start + len(ids)]  # (T, C)
        out = {"token_plus_position": tok + pos, "token_only": tok,
               "position_only": pos}[COMPOSES.get(compose, compose)]
        return out.to(CASTS[dtype]).float().numpy()

    return rows


def run_cli(node: str, *args: str,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``node client/node/cli.js ARGS`` as a user would run it (``env`` added to a
    environment without $EMBED_TOKEN)."""
    environ = {k: v for k, v in os.environ.items() if k != "EMBED_TOKEN"}
    return subprocess.run([node, str(CLI), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False, env={**environ, **(env or {})})


def cli_json(node: str, *args: str, env: dict[str, str] | None = None) -> Any:
    """Run the CLI, require success and a quiet stderr, return its JSON."""
    proc = run_cli(node, *args, env=env)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    return json.loads(proc.stdout)


def values(out: dict[str, Any], shape: list[int]) -> np.ndarray:
    """The decoded values the Node client printed (little-endian float32, base64)."""
    return np.frombuffer(base64.b64decode(out["values_b64"]), dtype="<f4").reshape(shape)


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit for bit (also tells -0 from +0), with a readable first difference."""
    assert got.shape == want.shape
    diff = np.flatnonzero(got.astype("<f4").view("<u4") != want.astype("<f4").view("<u4"))
    assert diff.size == 0, f"{diff.size} values differ; first at {diff[0]}: " \
                           f"{got.flat[diff[0]]!r} != {want.flat[diff[0]]!r}"


def untrained(ids: list[int]) -> list[int]:
    """Indices whose token row the tiny checkpoint marks as never updated."""
    return [i for i, t in enumerate(ids) if t >= TRAINED_ROWS]


def checkpoint_id(tiny_repo: Path) -> str:
    return hashlib.sha256((tiny_repo / "tiny" / "1" / "manifest.json").read_bytes()).hexdigest()


@pytest.mark.parametrize("compose", list(COMPOSES))
@pytest.mark.parametrize("dtype", ["DTYPE_FLOAT32", "DTYPE_FLOAT16", "DTYPE_BFLOAT16"])
def test_embed_ids_every_dtype_and_compose(node: str, server: ServerHandle, tiny_repo: Path,
                                           expected: Expected, dtype: str,
                                           compose: str) -> None:
    request = {"token_ids": {"ids": IDS}, "start_position": 3, "compose": compose,
               "dtype": dtype, "request_id": f"node-{dtype}-{compose}"}
    out = cli_json(node, "embed", "--target", server.target, "--request", json.dumps(request))
    want = expected(IDS, 3, compose, dtype)
    assert_bits_equal(values(out, [5, 16]), want)
    if dtype != "DTYPE_FLOAT32":  # the cast is real: these rows differ from the fp32 ones
        assert not np.array_equal(want, expected(IDS, 3, compose, "DTYPE_FLOAT32"))
    del out["values_b64"]
    assert out == {"shape": [5, 16], "dtype": dtype, "token_ids": IDS, "start_position": 3,
                   "model": "tiny", "version": 1, "checkpoint_id": checkpoint_id(tiny_repo),
                   "truncated_tokens": 0, "untrained_token_indices": untrained(IDS),
                   "request_id": f"node-{dtype}-{compose}"}


def test_embed_text_float16(node: str, server: ServerHandle, expected: Expected) -> None:
    request = {"text": "hello world", "dtype": "DTYPE_FLOAT16", "model": "tiny"}
    out = cli_json(node, "embed", "--target", server.target, "--request", json.dumps(request))
    assert (out["token_ids"], out["shape"], out["dtype"]) == \
        (HELLO_WORLD, [2, 16], "DTYPE_FLOAT16")
    assert_bits_equal(values(out, [2, 16]), expected(HELLO_WORLD, 0, "token_plus_position",
                                                     "FP16"))


def test_embed_stream_answers_in_request_order(node: str, server: ServerHandle,
                                               expected: Expected) -> None:
    # Different lengths, dtypes and positions, so a reordered or mixed-up answer shows.
    cases = [(IDS, 0, "COMPOSE_TOKEN_PLUS_POSITION", "DTYPE_FLOAT32"),
             ([9, 8], 60, "COMPOSE_TOKEN_PLUS_POSITION", "DTYPE_BFLOAT16"),
             ([50256] * 7, 1, "COMPOSE_TOKEN_ONLY", "DTYPE_FLOAT16"),
             ([1], 63, "COMPOSE_POSITION_ONLY", "DTYPE_FLOAT32")]
    requests = [{"token_ids": {"ids": ids}, "start_position": start, "compose": compose,
                 "dtype": dtype, "request_id": f"r{i}"}
                for i, (ids, start, compose, dtype) in enumerate(cases)]
    outs = cli_json(node, "stream", "--target", server.target,
                    "--requests", json.dumps(requests))
    assert [o["request_id"] for o in outs] == ["r0", "r1", "r2", "r3"]
    for out, (ids, start, compose, dtype) in zip(outs, cases, strict=True):
        assert (out["token_ids"], out["start_position"], out["dtype"]) == (ids, start, dtype)
        assert_bits_equal(values(out, [len(ids), 16]), expected(ids, start, compose, dtype))


@pytest.mark.parametrize(("datatype", "compose"), [("FP32", "token_plus_position"),
                                                   ("FP16", "token_only"),
                                                   ("BF16", "position_only")])
def test_model_infer_ids(node: str, server: ServerHandle, tiny_repo: Path,
                         expected: Expected, datatype: str, compose: str) -> None:
    batch = [[31373, 995, 11], [50256, 0, 7]]
    request = {"model_name": "tiny", "id": "infer-1", "input_ids": batch, "start_position": 2,
               "compose": compose, "datatype": datatype}
    out = cli_json(node, "infer", "--target", server.target, "--request", json.dumps(request))
    embeddings, lengths = out["outputs"]
    assert (out["model_name"], out["model_version"], out["id"]) == ("tiny", "1", "infer-1")
    assert out["parameters"] == {"checkpoint_id": checkpoint_id(tiny_repo),
                                 "truncated_tokens": 0, "start_position": 2}
    assert (embeddings["name"], embeddings["datatype"], embeddings["shape"]) == \
        ("embeddings", datatype, [2, 3, 16])
    want = np.stack([expected(row, 2, compose, datatype) for row in batch])  # (B, T, C)
    assert_bits_equal(values(embeddings, [2, 3, 16]), want)
    assert lengths == {"name": "sequence_lengths", "datatype": "INT64", "shape": [2],
                       "values": [3, 3]}


def test_model_infer_ragged_text_pads_with_zeros(node: str, server: ServerHandle,
                                                 expected: Expected) -> None:
    request = {"text": ["hello world", "hello"], "datatype": "BF16"}
    out = cli_json(node, "infer", "--target", server.target, "--request", json.dumps(request))
    embeddings, lengths = out["outputs"]
    assert lengths["values"] == [2, 1]
    want = np.zeros((2, 2, 16), dtype=np.float32)
    want[0] = expected(HELLO_WORLD, 0, "token_plus_position", "BF16")
    want[1, :1] = expected(HELLO, 0, "token_plus_position", "BF16")
    assert_bits_equal(values(embeddings, [2, 2, 16]), want)


@pytest.mark.parametrize(("command", "request_json", "code", "names"), [
    ("embed", {"token_ids": {"ids": [50257]}}, "INVALID_ARGUMENT", "50257"),
    ("embed", {"model": "nope", "text": "hi"}, "NOT_FOUND", "nope"),
    ("infer", {"input_ids": [[1, 2]], "start_position": 70}, "INVALID_ARGUMENT", "70"),
])
def test_errors_are_one_line_with_the_status_code(node: str, server: ServerHandle,
                                                  command: str, request_json: dict[str, Any],
                                                  code: str, names: str) -> None:
    proc = run_cli(node, command, "--target", server.target, "--request",
                   json.dumps(request_json))
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.startswith(f"error: {code}: "), proc.stderr
    assert names in proc.stderr
    assert proc.stderr.count("\n") == 1


@pytest.mark.parametrize(("spelling", "compose"), [("token", "token_only"),
                                                  ("token_only", "token_only"),
                                                  ("position", "position_only")])
def test_embed_takes_every_tools_spelling(node: str, server: ServerHandle, expected: Expected,
                                          spelling: str, compose: str) -> None:
    # The spellings the Python client and embedctl take mean the same here (they used to
    # fall back to token+position silently: positions then got added twice downstream).
    request = {"token_ids": {"ids": IDS}, "start_position": 3, "compose": spelling,
               "dtype": "float16"}
    out = cli_json(node, "embed", "--target", server.target, "--request", json.dumps(request))
    assert out["dtype"] == "DTYPE_FLOAT16"
    assert_bits_equal(values(out, [5, 16]), expected(IDS, 3, compose, "FP16"))
    assert not np.array_equal(expected(IDS, 3, compose, "FP16"),
                              expected(IDS, 3, "token_plus_position", "FP16"))


@pytest.mark.parametrize(("command", "request_json", "message"), [
    ("embed", {"text": "hi", "compose": "COMPOSE_TOKN_ONLY"},
     "compose 'COMPOSE_TOKN_ONLY': expected one of token+position, token_plus_position, "
     "COMPOSE_TOKEN_PLUS_POSITION, token, token_only, COMPOSE_TOKEN_ONLY, position, "
     "position_only, COMPOSE_POSITION_ONLY"),
    ("embed", {"text": "hi", "start_positon": 5},
     "unknown option 'start_positon'; known options: add_special_tokens, "
     "allow_special_tokens, compose, dtype, model, output, request_id, start_position, text, "
     "token_ids, truncate, version"),
    ("embed", {"text": "hi", "dtype": "half"}, "dtype 'half': expected one of float32, FP32, "
     "DTYPE_FLOAT32, float16, FP16, DTYPE_FLOAT16, bfloat16, BF16, DTYPE_BFLOAT16"),
    ("infer", {"input_ids": [[1, 2]], "compose": "sideways"}, "compose 'sideways': expected "
     "one of token+position, token_plus_position"),
    ("infer", {"input_ids": [[1, 2]], "dtype": "FP16"},
     "unknown option 'dtype'; known options: compose, datatype, id, input_ids, model_name, "
     "model_version, start_position, text, truncate"),
])
def test_unknown_keys_and_spellings_are_refused(node: str, command: str,
                                                request_json: dict[str, Any],
                                                message: str) -> None:
    # Refused as the command line is parsed, before anything is sent: the target has
    # nothing listening, and the error is still the client's own message, not "server not
    # reachable"; a usage error, exit status 2.
    proc = run_cli(node, command, "--target", "127.0.0.1:1", "--request",
                   json.dumps(request_json))
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith(f"error: --request: {message}"), proc.stderr
    assert proc.stderr.endswith(" (see --help)\n")
    assert proc.stderr.count("\n") == 1


def test_stream_refuses_a_bad_request_before_sending_any(node: str) -> None:
    requests = [{"text": "a"}, {"text": "b", "compose": "tokens"}]
    proc = run_cli(node, "stream", "--target", "127.0.0.1:1", "--requests",
                   json.dumps(requests))
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith("error: --requests: request 1: compose 'tokens': "
                                  "expected one of ")


@pytest.mark.parametrize(("tests_file", "at_least"), [(DECODE_TESTS, 7), (GRAMMAR_TESTS, 7),
                                                     (CLI_TESTS, 3)])
def test_node_unit_tests_pass(node: str, tests_file: Path, at_least: int) -> None:
    # The pure decode tests, the shared input-table tests (tests/vectors/
    # client_inputs.json through grammar.js and the page's parser) and the CLI's option
    # walk (cli.test.js), run by Node's own runner: all of them, none failed.
    declared = len(re.findall(r"^\s*test\(", tests_file.read_text(), flags=re.M))
    # TAP named explicitly: newer Node versions default to the "spec" reporter.
    proc = subprocess.run([node, "--test", "--test-reporter=tap", str(tests_file)],
                          cwd=NODE_DIR, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    counts = dict(re.findall(r"^# (pass|fail|skipped|todo|cancelled) (\d+)$", proc.stdout,
                             flags=re.M))
    assert counts == {"pass": str(declared), "fail": "0", "skipped": "0", "todo": "0",
                      "cancelled": "0"}
    assert declared >= at_least


@pytest.fixture(scope="module")
def token_server(tiny_repo: Path) -> Iterator[ServerHandle]:
    """A plaintext server that wants `authorization: Bearer n0de-s3cret`."""
    handle = start_server(tiny_repo, auth_token=TOKEN)
    yield handle
    handle.stop(grace=0.5)


def one_line_failure(proc: subprocess.CompletedProcess[str]) -> str:
    """A failed call: exit status 1, nothing on stdout, one stderr line 'error: ...'."""
    assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: "), proc.stderr
    return proc.stderr.removeprefix("error: ").rstrip("\n")


def test_token_from_option_and_environment(node: str, token_server: ServerHandle,
                                           expected: Expected) -> None:
    """Each call carries `authorization: Bearer <token>` as metadata, over plaintext."""
    request = json.dumps({"token_ids": {"ids": IDS}, "start_position": 3})
    want = expected(IDS, 3, "token_plus_position", "FP32")
    out = cli_json(node, "embed", "--target", token_server.target, "--request", request,
                   "--token", TOKEN)
    assert_bits_equal(values(out, [5, 16]), want)
    out = cli_json(node, "embed", "--target", token_server.target, "--request", request,
                   env={"EMBED_TOKEN": TOKEN})
    assert_bits_equal(values(out, [5, 16]), want)
    [streamed] = cli_json(node, "stream", "--target", token_server.target, "--requests",
                          f"[{request}]", "--token", TOKEN)
    assert_bits_equal(values(streamed, [5, 16]), want)
    inferred = cli_json(node, "infer", "--target", token_server.target, "--request",
                        json.dumps({"input_ids": [IDS], "start_position": 3}),
                        env={"EMBED_TOKEN": TOKEN})
    assert_bits_equal(values(inferred["outputs"][0], [1, 5, 16]), want[None])


@pytest.mark.parametrize("command", ["embed", "stream", "infer"])
def test_without_or_with_a_wrong_token_says_what_to_do(node: str, token_server: ServerHandle,
                                                       command: str) -> None:
    option, request = {"embed": ("--request", '{"text": "hi"}'),
                       "stream": ("--requests", '[{"text": "hi"}]'),
                       "infer": ("--request", '{"text": ["hi"]}')}[command]
    base = [command, "--target", token_server.target, option, request]
    missing = one_line_failure(run_cli(node, *base))
    assert missing.startswith("UNAUTHENTICATED: "), missing
    assert missing.endswith(": the server wants a bearer token; pass it with --token (or "
                            "$EMBED_TOKEN)"), missing
    for wrong in (run_cli(node, *base, "--token", "nope"),
                  run_cli(node, *base, env={"EMBED_TOKEN": "nope"})):
        line = one_line_failure(wrong)
        assert line.startswith("UNAUTHENTICATED: "), line
        assert line.endswith(": the server refused this token; check --token (or "
                             "$EMBED_TOKEN)"), line
    # --token wins over the environment, as embedctl's does
    cli_json(node, *base, "--token", TOKEN, env={"EMBED_TOKEN": "nope"})


def test_a_token_no_header_can_carry_is_refused_before_any_connection(node: str) -> None:
    """Never echoed (it is a secret); nothing listens at the target, and it is not asked."""
    proc = run_cli(node, "embed", "--target", "127.0.0.1:1", "--request", '{"text": "a"}',
                   env={"EMBED_TOKEN": "s3cret\n"})
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == ("error: EMBED_TOKEN: must be a token of visible ASCII characters, "
                           "without spaces or line breaks; this one has a line break at "
                           "character 7 of 7 (see --help)\n")
    library = ("const { embed } = require('./embed');"
               "embed('127.0.0.1:1', { text: 'a' }, { token: 'a b' })"
               ".catch((err) => console.log(err.code === undefined, err.message));")
    out = subprocess.run([node, "-e", library], cwd=NODE_DIR, capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.stdout == ("true options.token: must be a token of visible ASCII characters, "
                          "without spaces or line breaks; this one has a space at character "
                          "2 of 3\n"), out.stderr


# The listener (tests/client/conftest.py's targets; {target}: its address) and the one line
# the CLI says. Before: grpc-js's own text, ending in an empty 'Resolution note: '.
NO_ANSWER = {
    "closed": "nothing is listening at {target} (connection refused): start the server, or "
              "point --target at its gRPC port",
    "no socket file": "nothing is listening at {target} (no such socket file): start the "
                      "server, or point --target at its socket",
    "no such host": "cannot resolve the host of {target} (no such host): check --target",
    "REST": "{target} is an HTTP/1.x server, not gRPC (it answered 'HTTP/1.0 400 Bad "
            "Request'): point --target at the gRPC port; the service's REST API and page are "
            "on another port",
    "hangs up": "{target} accepted the connection but does not speak gRPC (closed the "
                "connection): check the port in --target",
    "TLS": "{target} speaks TLS, and this CLI connects in plaintext only: point --target at a "
           "plaintext port, or call embed.js with {{ credentials: "
           "grpc.credentials.createSsl(...) }}",
}


@pytest.mark.parametrize("listener", list(NO_ANSWER))
def test_no_answer_is_one_clear_line(node: str, targets: dict[str, str], listener: str) -> None:
    target = targets[listener]
    proc = run_cli(node, "embed", "--target", target, "--request", '{"text": "a"}',
                   "--timeout", "10")
    assert one_line_failure(proc) == NO_ANSWER[listener].format(target=target)
