"""The docs' world: a sandbox laid out like the checkout, a model trained as ``make run``
trains it, and the server started as ``make run`` starts it, on the ports the docs name.

The sandbox holds a symlink to each top-level entry of the checkout (so ``.venv/bin/...``,
``scripts/...``, ``client/node/...`` resolve as in the docs) and real directories for what
commands write (``models/``, ``runs/``, ``data_cache/``, outputs such as ``x.npy``), so no
doc command writes into the checkout. The inputs a doc names are made here too
(``corpus/``, ``more.jsonl``, ``./gpt2-dir``): the docs say what they are.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PORTS = {"grpc": 50051, "http": 8000, "metrics": 9464}  # as README.md's quickstart names them
# Written by commands: real directories in the sandbox, never links into the checkout.
WRITABLE = {"models", "runs", "data_cache", "bench", "x.npy"}
# Training commands in the docs run the real job, shortened by its environment (flags win
# over EMBED_TRAIN_*, so a command's own flags still apply): a tiny block and batch.
TRAIN_ENV = {"EMBED_TRAIN_MAX_STEPS": "3", "EMBED_TRAIN_SPARSE_EMBEDDINGS": "1",
             "EMBED_TRAIN_N_LAYER": "1",
             "EMBED_TRAIN_BLOCK_SIZE": "8", "EMBED_TRAIN_BATCH_SIZE": "2",
             "EMBED_TRAIN_WARMUP_STEPS": "1", "EMBED_TRAIN_EVAL_TOKENS": "64",
             "EMBED_TRAIN_EVAL_EVERY": "500", "EMBED_TRAIN_PROGRESS": "0"}
# The quickstart's model: the default config (its widths: what the docs' outputs show),
# trained for a few steps only.
MODEL_ENV = {"EMBED_TRAIN_MAX_STEPS": "3", "EMBED_TRAIN_EVAL_TOKENS": "256",
             "EMBED_TRAIN_WARMUP_STEPS": "1", "EMBED_TRAIN_PROGRESS": "0"}


class LiveServer:
    """A server process started from a command line in the sandbox, until stopped."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str]) -> None:
        self.log_path = cwd / f"server-{abs(hash(command))}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env,
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 60
        while " serving " not in self.log:
            assert self.proc.poll() is None, f"`{command}` exited:\n{self.log}"
            assert time.monotonic() < deadline, f"`{command}` not serving in 60 s:\n{self.log}"
            time.sleep(0.2)

    @property
    def log(self) -> str:
        """What the server printed so far."""
        return self.log_path.read_text()

    def stop(self) -> int:
        """SIGTERM (drain, then exit) and the exit status; SIGKILL after 30 s."""
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()
        finally:
            self._log.close()


@dataclass
class Sandbox:
    """Where doc commands run, the environment they run with, and the quickstart's server."""

    path: Path
    env: dict[str, str]
    serve_command: str
    server: LiveServer | None = None

    def bash(self, script: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run ``script`` as a bash script in the sandbox (errexit, pipefail)."""
        return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=self.path,
                              env=self.env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    @contextlib.contextmanager
    def quickstart_stopped(self) -> Iterator[None]:
        """The quickstart's server stopped (its ports free for a doc's own server), then back."""
        assert self.server is not None
        assert self.server.stop() == 0, self.server.log
        try:
            yield
        finally:
            self.server = LiveServer(self.serve_command, self.path, self.env)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def make_recipe(target: str) -> list[str]:
    """The recipe lines of a Makefile target, without make's ``@``."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if re.match(rf"^{re.escape(target)}:", ln))
    recipe = []
    for ln in lines[start + 1:]:
        if not ln.startswith("\t"):
            break
        recipe.append(ln.strip().lstrip("@").replace("$(PY)", ".venv/bin/python"))
    return recipe


def _lay_out(path: Path) -> None:
    for entry in ROOT.iterdir():
        if entry.name not in WRITABLE and entry.name != ".git":
            (path / entry.name).symlink_to(entry)
    (path / "bench").mkdir()
    for entry in (ROOT / "bench").iterdir():
        if entry.name != "results":
            (path / "bench" / entry.name).symlink_to(entry)
    # The inputs the docs' commands name.
    (path / "corpus" / "a").mkdir(parents=True)
    (path / "corpus" / "a" / "one.txt").write_text("The cat walks to the door. " * 200)
    (path / "more.jsonl").write_text(json.dumps({"text": "A dog runs in the park. " * 100})
                                     + "\n")
    from examples.hf_inputs_embeds import build_hf_gpt2
    build_hf_gpt2(path / "gpt2-dir")  # README's "./gpt2-dir": a small GPT-2, saved as HF does


@pytest.fixture(scope="module")  # the server stops with the doc tests, not the session
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """The sandbox with the quickstart's model served on the docs' ports."""
    taken = [f"{name} {port}" for name, port in PORTS.items() if not _port_free(port)]
    if taken:
        pytest.fail(f"the docs' ports are in use ({', '.join(taken)}): the doc tests start "
                    f"the server on them as README.md does; stop what listens there")
    path = tmp_path_factory.mktemp("docs")
    _lay_out(path)
    # The venv's scripts on PATH (embedctl, as after `pip install`), the checkout importable.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(path),
           "PATH": f"{path / '.venv' / 'bin'}:{os.environ['PATH']}"}
    env.pop("EMBED_TARGET", None)
    model, run = make_recipe("model"), make_recipe("run")
    assert model == [".venv/bin/python -m training.default_model --model-repository models"]
    assert len(run) == 1
    assert run[0].startswith("scripts/serve.sh ")
    trained = subprocess.run(model[0].split(), cwd=path, env={**env, **MODEL_ENV},
                             capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    box = Sandbox(path, {**env, **TRAIN_ENV}, run[0])
    box.server = LiveServer(run[0], path, box.env)
    try:
        yield box
    finally:
        if box.server is not None:
            box.server.stop()
