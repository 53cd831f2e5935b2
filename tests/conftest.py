"""Shared fixtures: real checkpoints written by the real writer, real servers on port 0.

Also the skip guard: a test may skip only for want of a GPU (``@pytest.mark.gpu``, whose
reason is exactly "no CUDA device"). Any other skip fails the run and is listed with its
reason, so a missing tool or package can never turn into a green run that tested less.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.format.tokenizer import default_ranks_path, gpt2_spec
from service.format.writer import write_checkpoint
from service.local import ServerHandle
from tests.oip_cases import SERVERS
from tests.tiny_model import (
    DIM,
    MAX_SEQ_LEN,
    TABLE_ROWS,
    TRAINED_ROWS,
    VOCAB_SIZE,
    MakeCheckpoint,
    start,
    tiny_tables,
)

GPU_SKIP_REASON = "no CUDA device"


class SkipGuard:
    """Collects every skip whose reason is not GPU_SKIP_REASON and fails the run on them."""

    TITLE = f"skipped for a reason other than {GPU_SKIP_REASON!r}: this fails the run"
    HINT = ("Install what they need (make test installs its tools) or, for a test that "
            "needs a GPU, mark it @pytest.mark.gpu.")

    def __init__(self) -> None:
        self.bad: list[tuple[str, str]] = []  # (node id, reason)

    def _note(self, report: pytest.CollectReport | pytest.TestReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        longrepr = report.longrepr
        # A skip reports (path, line, "Skipped: <reason>"); pytest's -ra summary reads it so.
        message = str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)
        reason = message.removeprefix("Skipped: ")
        if reason != GPU_SKIP_REASON:
            self.bad.append((report.nodeid, reason))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """Module-level skips: pytest.importorskip, pytest.skip(allow_module_level=True)."""
        self._note(report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """skip/skipif markers, pytest.skip() in a test or fixture."""
        self._note(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """A run that would pass fails instead (pytest returns session.exitstatus)."""
        if self.bad and session.exitstatus in (pytest.ExitCode.OK,
                                               pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """Name each offending test and its reason, and how to fix it."""
        if not self.bad:
            return
        terminalreporter.section(self.TITLE, sep="=", red=True, bold=True)
        for nodeid, reason in self.bad:
            terminalreporter.line(f"{nodeid}: {reason}")
        terminalreporter.line(self.HINT)


def pytest_configure(config: pytest.Config) -> None:
    """Register the gpu marker and the skip guard."""
    config.addinivalue_line(
        "markers", f"gpu: needs a CUDA device; skipped with reason {GPU_SKIP_REASON!r} without")
    config.pluginmanager.register(SkipGuard(), "embed-skip-guard")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip gpu-marked tests, with the one allowed reason, where CUDA is unavailable."""
    if torch.cuda.is_available():
        return
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.skip(reason=GPU_SKIP_REASON))


@pytest.fixture(scope="session")
def gpt2_ranks() -> Path:
    """The verified GPT-2 BPE ranks (scripts/fetch_tokenizer.py put them there)."""
    path = default_ranks_path()
    if not path.exists():
        pytest.fail(f"{path} missing: run scripts/setup.sh (make test does)")
    return path


@pytest.fixture(scope="session")
def make_checkpoint(gpt2_ranks: Path) -> MakeCheckpoint:
    """Write a random-table checkpoint with the GPT-2 tokenizer; returns the version dir."""

    def make(repo: Path, name: str = "tiny", version: int = 1, seed: int = 0,
             position: str = "learned", dim: int = DIM, max_seq_len: int = MAX_SEQ_LEN,
             row_updates: bool = True) -> Path:
        token_table, position_table = tiny_tables(seed, dim, max_seq_len)
        updates = None
        if row_updates:
            updates = torch.zeros(TABLE_ROWS, dtype=torch.int64)
            updates[:TRAINED_ROWS] = 7
        out = repo / name / str(version)
        write_checkpoint(out, token_table=token_table,
                         position_table=position_table if position == "learned" else None,
                         position=position, max_seq_len=max_seq_len, vocab_size=VOCAB_SIZE,
                         tokenizer_spec=gpt2_spec(), tokenizer_ranks=gpt2_ranks,
                         row_updates=updates, provenance={"source": "test", "seed": seed})
        return out

    return make


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory, make_checkpoint: MakeCheckpoint) -> Path:
    """A repository with model "tiny" (learned) and "rope" (position none)."""
    repo = tmp_path_factory.mktemp("models")
    make_checkpoint(repo, "tiny")
    make_checkpoint(repo, "rope", position="none", seed=1)
    return repo


@pytest.fixture(scope="session")
def server(tiny_repo: Path) -> Iterator[ServerHandle]:
    """One shared server over the tiny repository (read-only tests only)."""
    handle = start(tiny_repo)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def grpc_server(server: ServerHandle) -> ServerHandle:
    """The server ``channel`` opens onto: the shared one, unless a folder's conftest or a
    module gives its own fixture of this name."""
    return server


@pytest.fixture(scope="module")
def channel(grpc_server: ServerHandle) -> Iterator[grpc.Channel]:
    """A plaintext channel to ``grpc_server``, open for the module's tests."""
    with grpc.insecure_channel(grpc_server.target) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> pb_grpc.EmbeddingServiceStub:
    """The native service on ``channel``."""
    return pb_grpc.EmbeddingServiceStub(channel)


@pytest.fixture(scope="module")
def cpu_server(tiny_repo: Path) -> Iterator[ServerHandle]:
    """Tables on the CPU whatever EMBED_TEST_DEVICE says (gpu.sh runs the tests on a GPU):
    the server that refuses CUDA shared memory."""
    with start(tiny_repo, device="cpu") as handle:
        yield handle


@pytest.fixture(scope="session")
def case_servers(server: ServerHandle, tiny_repo: Path) -> Iterator[dict[str, ServerHandle]]:
    """The servers the shared OIP request table names (tests/oip_cases.py): "tiny" is the
    shared server; the others start here, with the table's settings."""
    started = {name: start(tiny_repo, **settings)
               for name, settings in SERVERS.items() if name != "tiny"}
    yield {"tiny": server, **started}
    for handle in started.values():
        handle.stop()
