"""Start-up mistakes: ``python -m service`` refuses each, as a real subprocess, with exit
status 2 and one line on stderr naming the flag, port or path and the fix; no traceback.
``--help`` describes every flag from the config's own fields."""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import grpc
import pytest
import torch

from client.flags import flag_name
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.config import ServerConfig, env_name
from service.format import checkpoint
from service.preflight import VERSION_NAME, StartupError, check_config
from tests.tiny_model import MakeCheckpoint, start

ROOT = Path(__file__).resolve().parents[2]
# Free ports for every listener unless a case says otherwise: only the mistake under test.
FREE = ["--grpc-port", "0", "--http-port", "0", "--metrics-port", "0", "--poll-seconds", "0"]


def refusal(*args: str, env: dict[str, str] | None = None) -> str:
    """Run ``python -m service`` expecting a refusal; returns its one stderr line."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "service", *args], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("python -m service: error: "), lines[0]
    assert proc.stdout == ""
    return lines[0]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, make_checkpoint: MakeCheckpoint) -> Path:
    """tiny versions 1 and 2."""
    root = tmp_path_factory.mktemp("startup")
    make_checkpoint(root, "tiny", version=1)
    make_checkpoint(root, "tiny", version=2, seed=1)
    return root


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another process-like listener holds on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_missing_repository(tmp_path: Path) -> None:
    line = refusal("--model-repository", str(tmp_path / "nope"), *FREE)
    assert f"--model-repository {tmp_path / 'nope'}: does not exist; create it" in line


def test_repository_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "models").write_text("")
    line = refusal("--model-repository", str(tmp_path / "models"), *FREE)
    assert f"--model-repository {tmp_path / 'models'}: is not a directory" in line


def test_unknown_default_model(repo: Path) -> None:
    line = refusal("--model-repository", str(repo), "--default-model", "gpt2", *FREE)
    assert (f"--default-model 'gpt2': no such model in {repo} (models: tiny); name one of "
            f"them, or leave it empty") in line


def test_pin_to_a_version_that_is_not_there(repo: Path) -> None:
    line = refusal("--model-repository", str(repo), "--pin-versions", "tiny=9", *FREE)
    assert f"--pin-versions tiny=9: {repo / 'tiny'} has no version 9 (versions: 1, 2)" in line


def test_pin_to_a_model_that_is_not_there(repo: Path) -> None:
    line = refusal("--model-repository", str(repo), "--pin-versions", "gpt2=1", *FREE)
    assert f"--pin-versions gpt2=1: no model 'gpt2' in {repo} (models: tiny)" in line


@pytest.mark.parametrize("spec", ["tiny=x", "tiny", "=3", "tiny=0", "tiny=-1"])
def test_malformed_pin(repo: Path, spec: str) -> None:
    line = refusal("--model-repository", str(repo), "--pin-versions", spec, *FREE)
    assert line == (f"python -m service: error: argument --pin-versions: {spec!r} is not "
                    f"<model>=<version> with a model name and a positive version, e.g. "
                    f"tiny=3,other=1 (see --help)")


def test_pin_twice(repo: Path) -> None:
    line = refusal("--model-repository", str(repo), "--pin-versions", "tiny=1,tiny=2", *FREE)
    assert "argument --pin-versions: model 'tiny' is pinned twice" in line


def test_device_that_is_not_there(repo: Path) -> None:
    if torch.cuda.is_available():  # a lent GPU machine: ask for one past the last
        spec = f"cuda:{torch.cuda.device_count()}"
        expected = f"--device {spec}: torch sees {torch.cuda.device_count()} CUDA device(s)"
    else:
        spec, expected = "cuda", "--device cuda: torch sees no CUDA device on this machine"
    line = refusal("--model-repository", str(repo), "--device", spec, *FREE)
    assert expected in line


def test_device_torch_does_not_know(repo: Path) -> None:
    line = refusal("--model-repository", str(repo), "--device", "gpu0", *FREE)
    assert line.endswith("argument --device: must be auto, cpu, cuda or cuda:N, got 'gpu0' "
                         "(see --help)")


@pytest.mark.parametrize("flag", ["--grpc-port", "--http-port", "--metrics-port"])
def test_port_in_use(repo: Path, held_port: int, flag: str) -> None:
    args = dict(zip(FREE[::2], FREE[1::2], strict=True))
    args[flag] = str(held_port)
    line = refusal("--model-repository", str(repo), *(x for kv in args.items() for x in kv))
    assert (f"{flag} {held_port}: port {held_port} on 127.0.0.1 is already in use") in line
    assert f"choose another port with {flag}" in line


def _free_below_held() -> tuple[int, socket.socket]:
    """A free port P and a listener holding P + 1 (the port below an arbitrary held one may
    be another program's)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        held = socket.socket()
        try:
            held.bind(("127.0.0.1", free + 1))
        except OSError:
            held.close()
            continue
        held.listen()
        return free, held
    raise RuntimeError("no free port with a free port above it")


def test_port_in_use_with_workers(repo: Path) -> None:
    """Worker 1's metrics port (--metrics-port + 1) is taken: refused before any worker."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        grpc_port = s.getsockname()[1]
    free, held = _free_below_held()
    with held:
        line = refusal("--model-repository", str(repo), "--workers", "2", "--grpc-port",
                       str(grpc_port), "--http-port", "-1", "--metrics-port", str(free))
    taken = free + 1
    assert f"--metrics-port {taken}: port {taken} on 127.0.0.1 is already in use" in line


def test_grpc_port_in_use_with_workers(repo: Path, held_port: int) -> None:
    line = refusal("--model-repository", str(repo), "--workers", "2", "--grpc-port",
                   str(held_port), "--http-port", "-1", "--metrics-port", "-1")
    assert f"--grpc-port {held_port}: port {held_port} on 127.0.0.1 is already in use" in line


def test_two_listeners_on_one_port(repo: Path) -> None:
    line = refusal("--model-repository", str(repo), "--grpc-port", "47123", "--http-port",
                   "47123", "--metrics-port", "-1")
    assert "--http-port 47123: the same port as --grpc-port" in line


def test_host_that_is_not_this_machine(repo: Path) -> None:
    line = refusal("--model-repository", str(repo), "--host", "192.0.2.1", *FREE[2:],
                   "--grpc-port", "47124")
    assert "--host 192.0.2.1: not an address of this machine" in line


def test_host_that_does_not_resolve(repo: Path) -> None:
    line = refusal("--model-repository", str(repo), "--host", "no-such-host.invalid", *FREE)
    assert "--host no-such-host.invalid: cannot be resolved" in line


def test_tls_file_that_is_not_there(repo: Path, tmp_path: Path) -> None:
    line = refusal("--model-repository", str(repo), "--tls-cert", str(tmp_path / "c.pem"),
                   "--tls-key", str(tmp_path / "k.pem"), *FREE)
    assert f"--tls-cert {tmp_path / 'c.pem'}: no such file" in line


def test_bad_value_from_flag_and_environment(repo: Path) -> None:
    line = refusal("--model-repository", str(repo), "--grpc-port", "x")
    assert line == ("python -m service: error: argument --grpc-port: must be a port 1..65535 "
                    "(0 picks a free port), got 'x' (see --help)")
    line = refusal("--model-repository", str(repo), *FREE, env={"EMBED_WORKERS": "two"})
    assert line == ("python -m service: error: EMBED_WORKERS: must be a number of processes "
                    ">= 1, got 'two' (see --help)")
    line = refusal("--model-repository", str(repo), *FREE, "--table-dtype", "int8")
    assert line == ("python -m service: error: argument --table-dtype: must be one of stored, "
                    "float32, float16, bfloat16, got 'int8' (see --help)")


def test_workers_need_fixed_ports(repo: Path) -> None:
    line = refusal("--model-repository", str(repo), "--workers", "2", *FREE)
    assert "--workers > 1 needs a fixed --grpc-port" in line


def test_a_worker_that_refuses_stops_the_server(repo: Path) -> None:
    """A worker's own refusal (here: the device, which only workers check) ends the server
    with status 2 at once, not a restart loop; the refusal is one line, no traceback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    proc = subprocess.run(
        [sys.executable, "-m", "service", "--model-repository", str(repo), "--workers", "2",
         "--grpc-port", str(port), "--http-port", "-1", "--metrics-port", "-1", "--device",
         spec], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"python -m service: error: --device {spec}: torch sees" in proc.stderr
    assert "refused to start; stopping the server" in proc.stderr
    assert "restarting it" not in proc.stderr


def test_help_describes_every_flag_with_env_and_default() -> None:
    proc = subprocess.run([sys.executable, "-m", "service", "--help"], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0
    # argparse wraps lines at spaces and after hyphens
    text = " ".join(proc.stdout.split()).replace("- ", "-")
    options = text.split("options:", 1)[1]
    for f in fields(ServerConfig):
        flag = flag_name(f.name)
        head = f"{flag}, --no-{flag[2:]} " if isinstance(f.default, bool) or f.default is None \
            else f"{flag} "
        entry = options.split(head, 1)[1]  # the option's own help
        help_text = " ".join(f.metadata["help"].split()).replace("- ", "-")
        default = f.default if not isinstance(f.default, str) else repr(f.default)
        shown = "unset" if default is None else str(default)
        assert f"{help_text} (env {env_name(f.name)}; default {shown})" in entry, f.name
    assert len(re.findall(r"\(env EMBED_", text)) == len(fields(ServerConfig))


def test_version_names_agree_with_the_checkpoint_format() -> None:
    """preflight cannot import the format (torch); its pattern must stay the same one."""
    assert VERSION_NAME.pattern == checkpoint._VERSION.pattern


def test_empty_repository_starts_live_but_not_ready(tmp_path: Path) -> None:
    """The deploy path: a default model and pin into an empty (still filling) repository
    are accepted at start; only a non-empty repository is checked against them."""
    check_config(ServerConfig(model_repository=tmp_path, default_model="tiny",
                              pin_versions="tiny=3"))
    (tmp_path / "other").mkdir()
    with pytest.raises(StartupError, match="--default-model 'tiny': no such model"):
        check_config(ServerConfig(model_repository=tmp_path, default_model="tiny"))


def test_default_model_that_never_arrives(tmp_path: Path, make_checkpoint: MakeCheckpoint,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """Started on an empty repository with --default-model tiny; "other" arrives: one
    warning, and a request naming no model is told it is the default that is missing."""
    handle = start(tmp_path, default_model="tiny")
    try:
        make_checkpoint(tmp_path, "other")
        with caplog.at_level(logging.WARNING, logger="service.engine.repository"):
            handle.refresh()
            handle.refresh()
        warnings = [r.getMessage() for r in caplog.records if "default model" in r.getMessage()]
        assert warnings == ["the default model 'tiny' (--default-model) is not loaded; loaded: "
                            "other. Requests that name no model get NOT_FOUND until it is"]
        with grpc.insecure_channel(handle.target) as channel:
            stub = pb_grpc.EmbeddingServiceStub(channel)
            with pytest.raises(grpc.RpcError) as e:
                stub.Embed(pb.EmbedRequest(text="hi"))
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            assert e.value.details() == (
                "the default model 'tiny' (the server's --default-model; the request named no "
                "model) is not loaded (loaded: other)")
            assert stub.Embed(pb.EmbedRequest(model="other", text="hi")).model == "other"
    finally:
        handle.stop()


def test_empty_repository_process_starts_and_stops(tmp_path: Path) -> None:
    """As a real process: an empty repository with a default model and a pin starts (live,
    not ready), then drains on SIGTERM with status 0."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "--model-repository", str(tmp_path),
         "--default-model", "tiny", "--pin-versions", "tiny=3", *FREE], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert " INFO service.server: serving none yet on 127.0.0.1:" in line, line
        assert "default model 'tiny'" in line
        proc.terminate()
        assert proc.wait(60) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def test_docs_table_names_every_flag() -> None:
    """docs/service.md's configuration table keeps up with the fields."""
    doc = (ROOT / "docs" / "service.md").read_text()
    table = doc.split("## Configuration", 1)[1].split("## Lifecycle", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `--")]
    named = set(re.findall(r"--[a-z-]+", " ".join(row.split(" | ")[0] for row in rows)))
    assert {flag_name(f.name) for f in fields(ServerConfig)} <= named


@pytest.mark.parametrize(("ports", "shown"), [
    ({"http_port": -1, "metrics_port": -1}, "http off, metrics off"),
    ({"http_port": 0, "metrics_port": -1}, "http :{http}, metrics off"),
    ({"http_port": -1, "metrics_port": 0}, "http off, metrics :{metrics}"),
    ({"http_port": 0, "metrics_port": 0}, "http :{http}, metrics :{metrics}")])
def test_serving_line_says_which_listeners_are_off(
        repo: Path, caplog: pytest.LogCaptureFixture, ports: dict[str, int], shown: str) -> None:
    """-1 turns a listener off: the start-up line says so (it said 'metrics :0')."""
    with caplog.at_level(logging.INFO, logger="service.server"):
        handle = start(repo, **ports)
    try:
        [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serving")]
        server = handle.server
        expected = shown.format(http=server.http_port, metrics=server.metrics_port)
        assert line == (f"serving tiny/2 ({server.repo.models['tiny'].checkpoint_id[:12]}) on "
                        f"127.0.0.1:{server.grpc_port} ({expected}, device cpu, default model "
                        f"'tiny')")
        assert ":0," not in line
    finally:
        handle.stop()
