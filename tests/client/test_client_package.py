"""The client installs on its own: docs/client.md's install line, run into a fresh venv
(no system site-packages), pulls in grpcio, protobuf and numpy only; torch, tiktoken and the
server's packages are not importable there, and the installed ``embedctl`` embeds against a
real server.

No network: the fresh venv's pip reads a local wheelhouse made here by zipping the files of
the distributions already installed in this venv (a wheel is that zip plus its dist-info),
so pip resolves and installs the client's dependencies exactly as it would from an index.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from service.local import ServerHandle

ROOT = Path(__file__).resolve().parents[2]
CLIENT_DEPENDENCIES = ("grpcio", "protobuf", "numpy")
FORBIDDEN = ("torch", "tiktoken", "safetensors", "transformers", "tokenizers", "service",
             "training", "bench")


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(names: tuple[str, ...]) -> set[str]:
    """``names`` and everything they require (no extras), as installed here."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = canonical(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for text in importlib.metadata.requires(name) or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def install_line() -> list[str]:
    """The one `pip install` line of docs/client.md's install block, as argv."""
    text = (ROOT / "docs" / "client.md").read_text(encoding="utf-8")
    lines = re.findall(r"^(pip install \S+)\s*(?:#.*)?$", text, flags=re.M)
    assert lines == ["pip install ./client"], lines
    return shlex.split(lines[0])


def rewheel(name: str, out: Path) -> Path:
    """The installed distribution ``name`` zipped back into a wheel in ``out``."""
    dist = importlib.metadata.distribution(name)
    tag = re.search(r"^Tag: (\S+)$", dist.read_text("WHEEL") or "", flags=re.M)
    assert tag is not None, name
    info = f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}.dist-info"
    wheel = out / f"{info.removesuffix('.dist-info')}-{tag.group(1)}.whl"
    records = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as z:
        for file in dist.files or ():
            posix = file.as_posix()
            if (posix.startswith("..") or "__pycache__" in posix
                    or posix.endswith(("/RECORD", "/INSTALLER", "/REQUESTED",
                                       "/direct_url.json"))):
                continue  # scripts outside site-packages (regenerated), caches, install marks
            z.write(file.locate(), posix)
            records.append(f"{posix},,")
        z.writestr(f"{info}/RECORD", "\n".join([*records, f"{info}/RECORD,,"]) + "\n")
    return wheel


def clean_env(venv: Path) -> dict[str, str]:
    """The fresh venv first on PATH; nothing of this checkout or its venv importable."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "EMBED_TARGET")
           and not k.startswith("PIP_")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}/usr/bin:/bin"
    # Only the wheelhouse: no index, and none of this machine's pip config (find-links,
    # constraints) that could hand pip something the client does not declare.
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_NO_INDEX"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def test_the_root_project_offers_no_client_extra() -> None:
    # Any extra of the root project installs torch with it: the client is ./client alone.
    root = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "client" not in root["project"]["optional-dependencies"]
    assert "torch" in root["project"]["dependencies"]
    client = tomllib.loads((ROOT / "client" / "pyproject.toml").read_text(encoding="utf-8"))
    assert [Requirement(r).name for r in client["project"]["dependencies"]] == list(
        CLIENT_DEPENDENCIES)


@pytest.mark.slow
def test_docs_install_line_gives_a_light_working_client(server: ServerHandle,
                                                        tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    # The client's dependencies with theirs (grpcio needs typing-extensions), and setuptools
    # for pip's isolated build of ./client (its [build-system] requires).
    needed = closure(CLIENT_DEPENDENCIES)
    for name in sorted(needed | {"setuptools"}):
        rewheel(name, wheels)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = clean_env(venv)
    outside = tmp_path / "elsewhere"  # not the checkout: its packages must not be on sys.path
    outside.mkdir()

    # The documented line, run from the root of a copy of the checkout that holds only
    # client/ and genproto/ (so the client needs nothing else from it, and setuptools'
    # in-place build files stay out of this checkout), offline: only the wheelhouse.
    checkout = tmp_path / "checkout"
    junk = shutil.ignore_patterns("node_modules", "build", "*.egg-info", "__pycache__")
    for part in ("client", "genproto"):
        shutil.copytree(ROOT / part, checkout / part, ignore=junk)
    argv = install_line()
    proc = run([str(venv / "bin" / "pip"), *argv[1:], "--find-links", str(wheels)], env,
               checkout)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    listed = run([str(venv / "bin" / "pip"), "list", "--format=json"], env, outside)
    names = {canonical(row["name"]) for row in json.loads(listed.stdout)}
    # The client, its dependencies' closure, and what `python -m venv` put there itself.
    assert names == {"embedding-client", "pip", "setuptools", *needed}
    assert needed == {"grpcio", "protobuf", "numpy", "typing-extensions"}
    assert run([str(venv / "bin" / "pip"), "check"], env, outside).returncode == 0

    probe = ("import importlib.util, json, client, genproto; print(json.dumps("
             "[client.__file__, genproto.__file__, "
             f"[n for n in {FORBIDDEN!r} if importlib.util.find_spec(n)]]))")
    proc = run([str(venv / "bin" / "python"), "-c", probe], env, outside)
    assert proc.returncode == 0, proc.stderr
    client_file, genproto_file, importable = json.loads(proc.stdout)
    assert client_file.startswith(str(venv))
    assert genproto_file.startswith(str(venv))
    shutil.rmtree(checkout)  # what runs next uses the venv alone
    assert importable == []  # no torch, tiktoken or server module in the client's venv

    proc = run(["embedctl", "--help"], env, outside)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith("usage: embedctl ")
    proc = run(["embedctl", "--target", server.target, "embed", "hello world",
                "--dtype", "float16"], env, outside)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "shape (2, 16)  dtype float16"
    assert lines[2] == "token_ids [31373, 995]"
    proc = run(["embedctl", "--target", server.target, "embed", "--ids", "1 2"], env, outside)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "embedctl: error: argument --ids: item 1 of the token ids, '1 2', is not an "
        "integer: give integers separated by commas, e.g. 1,2,3 (see --help)\n")
