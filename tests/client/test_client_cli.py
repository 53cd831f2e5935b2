"""embedctl against a real server: exact lines, exit codes, one-line errors."""

from __future__ import annotations

import functools
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from client import EmbeddingClient
from client.cli import main
from service.format.checkpoint import Checkpoint, read_checkpoint
from service.local import ServerHandle
from tests.tiny_model import start

ROOT = Path(__file__).resolve().parents[2]
HELLO_WORLD = [31373, 995]
TIMING = re.compile(r"timing  queue \d+ us  tokenize \d+ us  compute \d+ us  total \d+ us")


def embedctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m client.cli`` as a user would, from the repository root."""
    full_env = {k: v for k, v in os.environ.items() if k != "EMBED_TARGET"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "client.cli", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=60, check=False)


def preview(row: np.ndarray) -> str:
    return " ".join(f"{float(v):+.4f}" for v in row[:6]) + " ... (16 cols)"


def test_embed_hello_world_prints_exact_lines(server: ServerHandle, reference,
                                              tiny_checkpoint: Checkpoint,
                                              tmp_path: Path) -> None:
    out = tmp_path / "hw.npy"
    proc = embedctl("--target", server.target, "embed", "hello world", "--out", str(out))
    assert (proc.returncode, proc.stderr) == (0, "")
    lines = proc.stdout.splitlines()
    want = reference(HELLO_WORLD)
    assert lines[:6] == [
        "shape (2, 16)  dtype float32",
        f"model tiny  version 1  checkpoint {tiny_checkpoint.checkpoint_id[:12]}",
        "token_ids [31373, 995]",
        "start_position 0  truncated_tokens 0  untrained_token_indices [0]",
        f"[0] {preview(want[0])}",
        f"[1] {preview(want[1])}",
    ]
    assert TIMING.fullmatch(lines[6]), lines[6]
    assert lines[7:] == [f"saved {out}"]
    saved = np.load(out)
    assert saved.dtype == np.float32
    assert np.array_equal(saved, want)
    with EmbeddingClient(server.target) as c:
        assert np.array_equal(saved, c.embed("hello world").array)


def test_embed_ids_bfloat16_long_preview(server: ServerHandle, reference,
                                         capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import torch  # the oracle only

    monkeypatch.setenv("EMBED_TARGET", server.target)  # no --target: the env var is used
    ids = [1, 2, 3, 4, 5, 6]
    assert main(["embed", "--ids", "1,2,3,4,5,6", "--dtype", "bfloat16",
                 "--start-position", "3", "--compose", "token"]) == 0
    lines = capsys.readouterr().out.splitlines()
    want = torch.from_numpy(reference(ids, 3, "token")).bfloat16().float().numpy()
    assert lines[0] == "shape (6, 16)  dtype bfloat16 (widened to float32)"
    assert lines[2:4] == ["token_ids [1, 2, 3, 4, 5, 6]",
                          "start_position 3  truncated_tokens 0  untrained_token_indices []"]
    assert lines[4:9] == [f"[{i}] {preview(want[i])}" for i in range(4)] + ["... (2 more rows)"]


def test_tokenize_detokenize_models_info(server: ServerHandle, tiny_checkpoint: Checkpoint,
                                         tiny_repo: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    t = ["--target", server.target]
    assert main([*t, "tokenize", "hello world é"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "3 tokens", " 31373  'hello'", "   995  ' world'", " 38251  ' é'"]
    assert main([*t, "tokenize", "\u2603"]) == 0  # a snowman: two partial UTF-8 tokens
    assert capsys.readouterr().out.splitlines() == [
        "2 tokens", " 24583  b'\\xe2\\x98'", "   225  b'\\x83'"]
    assert main([*t, "detokenize", "31373,995"]) == 0
    assert capsys.readouterr().out == "hello world\n"
    assert main([*t, "models"]) == 0
    cid = tiny_checkpoint.checkpoint_id
    rope_cid = read_checkpoint(tiny_repo / "rope" / "1").checkpoint_id
    assert capsys.readouterr().out.splitlines() == [
        f"rope  v1  C=16  vocab_size=50257  max_seq_len=64  position=none  "
        f"checkpoint {rope_cid[:12]}",
        f"tiny  v1  default  C=16  vocab_size=50257  max_seq_len=64  position=learned  "
        f"checkpoint {cid[:12]}"]
    assert main([*t, "info", "--model", "tiny"]) == 0
    info = capsys.readouterr().out.splitlines()
    assert info[:4] == ["model tiny  version 1  (default)", f"checkpoint_id {cid}",
                        "vocab_size 50257  table_rows 50304  dim 16  max_seq_len 64  "
                        "position learned",
                        "storage_dtype float32  device cpu"]
    assert info[4].startswith("tokenizer tiktoken gpt2  tokenizer.tiktoken  sha256 ")
    assert info[5] == "family -  rules none  hidden_size 16"
    assert info[7] == "row_updates: 49257 untrained rows"


def test_error_is_one_line_on_stderr_with_exit_1(server: ServerHandle) -> None:
    proc = embedctl("--target", server.target, "embed", "--ids", "1,2,99999")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == ("embedctl: INVALID_ARGUMENT: input.token_ids.ids[2]=99999 is out "
                           "of range [0, 50257) for model 'tiny'\n")


@pytest.mark.parametrize(("args", "message"), [
    (["embed", "hello", "--model", "nope"],
     "embedctl: NOT_FOUND: model 'nope' is not loaded (loaded: rope, tiny)"),
    (["embed", "hello", "--compose", "position", "--model", "rope"],
     "embedctl: FAILED_PRECONDITION: compose=COMPOSE_POSITION_ONLY needs a position table; "
     "model 'rope' has position 'none'"),
    (["info", "--version", "7"],
     "embedctl: NOT_FOUND: version 7 of model 'tiny' is not loaded (serving version 1)"),
])
def test_errors_return_1_with_one_line(server: ServerHandle, args: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--target", server.target, *args]) == 1
    assert capsys.readouterr() == ("", message + "\n")


def test_unreachable_server_exact_message() -> None:
    proc = embedctl("--target", "127.0.0.1:1", "--timeout", "5", "embed", "hello world")
    assert (proc.returncode, proc.stdout) == (1, "")
    refused = ("embedctl: nothing is listening at 127.0.0.1:1 (connection refused): start the "
               "server, or point --target (or $EMBED_TARGET) at its gRPC port\n")
    assert proc.stderr == refused
    proc = embedctl("models", env={"EMBED_TARGET": "127.0.0.1:1"})
    assert proc.stderr == refused


def test_bad_usage_exits_2_with_one_line() -> None:
    proc = embedctl("embed", "--ids", "1,x")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "embedctl: error: argument --ids: item 2 of the token ids, 'x', is not an "
        "integer: give integers separated by commas, e.g. 1,2,3 (see --help)\n")


def test_out_file_that_cannot_be_written_is_one_line(server: ServerHandle,
                                                     tmp_path: Path) -> None:
    """The directory exists at the check but is read-only: the write's own refusal."""
    (tmp_path / "ro").mkdir(mode=0o500)
    proc = embedctl("--target", server.target, "embed", "hello", "--out",
                    str(tmp_path / "ro" / "x.npy"))
    if os.geteuid() == 0:  # root writes anyway: then the file is there, exactly
        assert (proc.returncode, proc.stderr) == (0, "")
        assert os.listdir(tmp_path / "ro") == ["x.npy"]
        return
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (f"embedctl: cannot write {tmp_path / 'ro' / 'x.npy'}: "
                           f"Permission denied\n")


def test_out_file_gets_the_usual_mode(server: ServerHandle, tmp_path: Path) -> None:
    """0666 less the umask, as np.save or any program writing a file gives (it was
    mkstemp's 0600 whatever the umask)."""
    for mask, mode in ((0o022, 0o644), (0o002, 0o664), (0o077, 0o600)):
        out = tmp_path / f"x{mask:o}.npy"
        proc = subprocess.run(
            [sys.executable, "-m", "client.cli", "--target", server.target, "embed", "hello",
             "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=60,
            check=False, preexec_fn=functools.partial(os.umask, mask))
        assert (proc.returncode, proc.stderr) == (0, "")
        assert stat.S_IMODE(out.stat().st_mode) == mode, f"umask {mask:o}"
        assert np.load(out).shape == (1, 16)


def test_a_shared_memory_region_too_small_names_the_bytes_needed(server: ServerHandle) -> None:
    proc = embedctl("--target", server.target, "embed", "hello world", "--shm",
                    "--shm-bytes", "100")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert re.fullmatch(
        r"embedctl: INVALID_ARGUMENT: output: the output needs 128 bytes at offset 0 but "
        r"region 'embedctl-\d+' has 100 bytes; the largest T that fits is 1: this request "
        r"needs --shm-bytes 128 or more \(it had 100\)\n", proc.stderr), proc.stderr


def test_models_on_an_empty_server_says_so(tmp_path: Path) -> None:
    empty = start(tmp_path)
    try:
        proc = embedctl("--target", empty.target, "models")
    finally:
        empty.stop()
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == ("no model is loaded: the server's model repository has no valid "
                           "version yet\n")


def test_embed_through_shared_memory(server: ServerHandle, reference, tmp_path: Path) -> None:
    out = tmp_path / "shm.npy"
    proc = embedctl("--target", server.target, "embed", "hello world", "--shm",
                    "--shm-bytes", "4096", "--out", str(out))
    assert (proc.returncode, proc.stderr) == (0, "")
    lines = proc.stdout.splitlines()
    assert lines[0] == "shape (2, 16)  dtype float32"
    assert lines[-2] == f"saved {out}"
    assert re.fullmatch(r"via shared memory /embed-embedctl-\d+-[0-9a-f]{8}", lines[-1])
    assert np.load(out).tobytes() == reference(HELLO_WORLD).tobytes()
    with EmbeddingClient(server.target) as c:
        assert c.list_shared_memory() == []  # embedctl unregistered its region
    assert not list(Path("/dev/shm").glob("embed-embedctl-*"))  # and unlinked it
