"""The Dockerfiles, checked without a Docker engine: instructions, the install step's shell
run against stubs, the torch check, and the HEALTHCHECK command against real servers."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch

from service.engine import kernel_build
from service.local import ServerHandle
from tests.deploy.conftest import DEPLOY, REPO
from tests.tiny_model import start

DOCKERFILES = ("Dockerfile", "Dockerfile.cuda")


def _instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) pairs, continuation lines joined, comments dropped."""
    lines = [ln for ln in (DEPLOY / "docker" / name).read_text().splitlines()
             if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", "\n", "\n".join(lines) + "\n")
    out: list[tuple[str, str]] = []
    for ln in joined.splitlines():
        if re.match(r"^[A-Z]+\s", ln):
            word, rest = ln.split(None, 1)
            out.append((word, rest))
        elif ln.strip() and out:
            out[-1] = (out[-1][0], out[-1][1] + "\n" + ln)
    return out


def _one(name: str, word: str) -> str:
    (rest,) = [r for w, r in _instructions(name) if w == word]
    return rest


def _args(name: str) -> dict[str, str]:
    return dict(r.split("=", 1) for w, r in _instructions(name) if w == "ARG")


def _install_step(name: str) -> str:
    (step,) = [r for w, r in _instructions(name) if w == "RUN" and "setup.sh" in r]
    return step


@pytest.mark.parametrize("name", DOCKERFILES)
def test_instructions(name: str) -> None:
    assert _args(name)["PYTHON_IMAGE"] == "python:3.11-slim"
    # A build stage for the lookup kernel, then the runtime stage (no compiler in it).
    assert [r for w, r in _instructions(name) if w == "FROM"] == [
        "${PYTHON_IMAGE} AS kernel", "${PYTHON_IMAGE}"]
    copies = [r for w, r in _instructions(name) if w == "COPY"]
    assert "--from=kernel /kernel/ /app/service/engine/" in copies
    assert _one(name, "USER") == "10001:10001"
    assert _one(name, "EXPOSE") == "50051 8000 9464"
    assert json.loads(_one(name, "VOLUME")) == ["/models"]
    assert json.loads(_one(name, "ENTRYPOINT")) == ["/app/scripts/serve.sh"]
    assert "scripts/setup.sh runtime;" in _install_step(name)
    env = " ".join(r for w, r in _instructions(name) if w == "ENV")
    assert "EMBED_MODEL_REPOSITORY=/models" in env
    assert "EMBED_HOST=0.0.0.0" in env
    device = "cuda" if name.endswith("cuda") else "cpu"
    assert f"EMBED_DEVICE={device}" in env


@pytest.mark.parametrize("name", DOCKERFILES)
def test_the_kernel_stage_builds_the_library_the_server_loads(name: str,
                                                             tmp_path: Path) -> None:
    """The stage's own steps, run here: the two files it copies, alone in a folder, and its
    build command with a bare Python (no torch, no project on the path) give the
    file name ``kernel.load`` looks for in /app/service/engine/."""
    steps = [r for w, r in _instructions(name) if w in ("COPY", "RUN")]
    copy = next(r for r in steps if r.endswith(" /src/"))
    build = next(r for r in steps if "kernel_build.py" in r and not r.endswith(" /src/"))
    assert build == "python3 /src/kernel_build.py /kernel"
    src = tmp_path / "src"
    src.mkdir()
    for rel in copy.split()[:-1]:
        shutil.copy(REPO / rel, src)
    assert sorted(p.name for p in src.iterdir()) == ["kernel_build.py", "lookup.c"]
    # -I -S: no site-packages (so no torch), no project on the path, as in the stage
    out = subprocess.run([sys.executable, "-I", "-S", str(src / "kernel_build.py"),
                          str(tmp_path / "kernel")], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    built = Path(out.stdout.strip())
    assert built.parent == tmp_path / "kernel"
    assert built.name == kernel_build.library_path().name
    assert oct(built.stat().st_mode & 0o777) == "0o644"  # readable by the image's uid 10001


@pytest.mark.parametrize("name", DOCKERFILES)
def test_pins_nothing_of_its_own(name: str) -> None:
    """Versions come from requirements.txt through setup.sh; the file names no package pin."""
    text = (DEPLOY / "docker" / name).read_text()
    assert "pip install" not in text
    assert re.search(r"[A-Za-z0-9_-]==\d", text) is None


def test_dockerignore_keeps_host_state_out() -> None:
    entries = set((REPO / ".dockerignore").read_text().split())
    assert {".venv/", ".git/", "models/", ".tools/"} <= entries


def _run_install_step(name: str, tmp_path: Path, **build_args: str) -> tuple[str, dict[str, str]]:
    """Run the RUN step with dash (the slim image's /bin/sh) against a stub setup.sh."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "requirements.txt", tmp_path / "requirements.txt")
    (tmp_path / "scripts").mkdir()
    stub = tmp_path / "scripts" / "setup.sh"
    stub.write_text('#!/bin/sh\nset -eu\necho "$1" > setup.args\n'
                    '(env | grep "^PIP_" || true) > pip.env\n'
                    'if [ -n "${PIP_CONSTRAINT:-}" ]; then\n'
                    '  cp "$PIP_CONSTRAINT" constraint.txt\nfi\n'
                    'mkdir -p .venv/bin\nprintf "#!/bin/sh\\nexit 0\\n" > .venv/bin/python\n'
                    'chmod +x .venv/bin/python\n')
    stub.chmod(0o755)
    env = {"PATH": os.environ["PATH"], **_args(name), **build_args}
    proc = subprocess.run(["dash", "-c", _install_step(name)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "setup.args").read_text() == "runtime\n"
    constraint = tmp_path / "constraint.txt"
    pip_env = dict(ln.split("=", 1) for ln in (tmp_path / "pip.env").read_text().splitlines())
    return (constraint.read_text() if constraint.exists() else ""), pip_env


def _torch_pin() -> str:
    (pin,) = re.findall(r"^torch==([0-9.]+)$", (REPO / "requirements.txt").read_text(), re.M)
    return pin


def test_cpu_install_selects_the_cpu_variant_of_the_pinned_torch(tmp_path: Path) -> None:
    constraint, pip_env = _run_install_step("Dockerfile", tmp_path)
    assert constraint == f"torch=={_torch_pin()}+cpu\n"
    assert pip_env["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"


def test_cuda_install_defaults_to_pypi_and_takes_a_variant(tmp_path: Path) -> None:
    constraint, pip_env = _run_install_step("Dockerfile.cuda", tmp_path / "default")
    assert constraint == ""
    assert "PIP_EXTRA_INDEX_URL" not in pip_env
    assert "PIP_CONSTRAINT" not in pip_env
    constraint, pip_env = _run_install_step(
        "Dockerfile.cuda", tmp_path / "cu126",
        TORCH_INDEX_URL="https://download.pytorch.org/whl/cu126", TORCH_VARIANT="cu126")
    assert constraint == f"torch=={_torch_pin()}+cu126\n"
    assert pip_env["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cu126"




@pytest.mark.parametrize(("name", "exit_code"), [
    ("Dockerfile", False),
    ("Dockerfile.cuda", "expected a CUDA build of torch"),
])
def test_torch_build_check_on_this_cpu_torch(name: str, exit_code: object) -> None:
    """The install step's own check, run here (torch is already imported): this machine's CPU
    torch passes the CPU image's check and fails the CUDA image's."""
    (check,) = re.findall(r'\.venv/bin/python -c "([^"]+)"', _install_step(name))
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as exited:
        exec(check, {})
    assert exited.value.code == exit_code
    assert out.getvalue() == f"torch {torch.__version__} cuda None\n"


def _healthcheck(name: str, port: int) -> int:
    rest = _one(name, "HEALTHCHECK")
    argv = json.loads(rest[rest.index("CMD") + 3:])
    assert argv[:2] == ["/app/.venv/bin/python", "-c"]
    env = {**os.environ, "EMBED_GRPC_PORT": str(port)}
    return subprocess.run([sys.executable, "-c", argv[2]], env=env, capture_output=True,
                          timeout=60).returncode


@pytest.mark.parametrize("name", DOCKERFILES)
def test_healthcheck_passes_on_a_serving_server(name: str, server: ServerHandle) -> None:
    assert _healthcheck(name, server.grpc_port) == 0


def test_healthcheck_fails_without_a_model_and_without_a_server(tmp_path: Path) -> None:
    empty = start(tmp_path)  # an empty repository: health NOT_SERVING
    try:
        assert _healthcheck("Dockerfile", empty.grpc_port) == 1
    finally:
        port = empty.grpc_port
        empty.stop()
    assert _healthcheck("Dockerfile", port) == 1  # nothing listens any more
