"""The client needs only grpcio, protobuf and numpy: no torch, no tiktoken, no service code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from service.local import ServerHandle

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("torch", "tiktoken", "safetensors", "service", "transformers")

# Runs in a fresh interpreter: any import of a BLOCKED package (or its submodules) fails.
SCRIPT = f"""
import importlib.abc, sys
BLOCKED = {BLOCKED!r}

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is blocked: the client must not need it")
        return None

sys.meta_path.insert(0, Block())
import client, client.client, client.codec, client.cli
from client import AsyncEmbeddingClient, EmbeddingClient
assert not [m for m in sys.modules if m.split(".")[0] in BLOCKED]
sys.exit(client.cli.main(sys.argv[1:]))
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)


def test_blocker_really_blocks() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT.replace("import client,", "import torch,")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert "ImportError: torch is blocked: the client must not need it" in proc.stderr


def test_client_imports_and_embeds_without_torch(server: ServerHandle) -> None:
    proc = run("--target", server.target, "embed", "hello world")
    assert (proc.returncode, proc.stderr) == (0, "")
    lines = proc.stdout.splitlines()
    assert lines[0] == "shape (2, 16)  dtype float32"
    assert lines[1].startswith("model tiny  version 1  checkpoint ")
    assert lines[2] == "token_ids [31373, 995]"
