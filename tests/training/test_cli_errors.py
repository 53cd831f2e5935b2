"""Mistakes a person makes with the training job and the importers, each run as a real
subprocess: exit status 2, one line on stderr naming the flag or file and the fix, no
traceback."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.training.conftest import corpus_text

ROOT = Path(__file__).resolve().parents[2]
# Small and fast: every case fails before the first step, or just after building the model.
TINY = ["--n-layer", "1", "--n-embd", "32", "--block-size", "16", "--max-steps", "2",
        "--no-progress"]


def refusal(module: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run ``python -m <module>`` expecting a refusal; returns its one stderr line."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def train_refusal(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    line = refusal("training", *TINY, "--runs-dir", str(tmp_path / "runs"), "--cache-dir",
                   str(tmp_path / "cache"), "--out-repository", str(tmp_path / "models"),
                   *args, cwd=tmp_path, env=env)
    assert line.startswith("python -m training: error: "), line
    return line.removeprefix("python -m training: error: ")


def test_data_glob_matching_nothing(tmp_path: Path) -> None:
    line = train_refusal(tmp_path, "--data", "corpus/*.txt")
    assert line == (f"--data corpus/*.txt: the pattern matches no file or directory (relative "
                    f"to {tmp_path}); check the path, or quote the glob so the shell does not "
                    f"expand it")


def test_data_file_that_is_not_there(tmp_path: Path) -> None:
    line = train_refusal(tmp_path, "--data", "nope.txt")
    assert line == f"--data nope.txt: no such file or directory (relative to {tmp_path})"


def test_data_directory_without_files(tmp_path: Path) -> None:
    """Before: an empty directory silently trained on the default corpus."""
    (tmp_path / "empty").mkdir()
    line = train_refusal(tmp_path, "--data", "empty")
    assert line == "--data empty: the directory empty holds no files"


def test_resume_without_state(tmp_path: Path) -> None:
    line = train_refusal(tmp_path, "--resume", "--name", "gone")
    state = tmp_path / "runs" / "gone" / "state" / "trainer.pt"
    assert line.startswith(f"--resume: no trainer state at {state}; ")
    assert line.endswith("or drop --resume to start fresh")


def test_resume_from_a_file_that_is_not_a_state(tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text(corpus_text())
    state = tmp_path / "runs" / "default" / "state" / "trainer.pt"
    state.parent.mkdir(parents=True)
    state.write_bytes(b"not a torch file")
    line = train_refusal(tmp_path, "--resume", "--data", "c.txt")
    assert line.startswith(f"--resume: {state} is not a readable trainer state (")
    assert line.endswith("); remove it to start fresh")


def test_resume_with_another_model_shape(tmp_path: Path) -> None:
    """Before: a size-mismatch traceback from load_state_dict, one line per tensor."""
    (tmp_path / "c.txt").write_text(corpus_text())
    common = [*TINY, "--data", "c.txt", "--runs-dir", str(tmp_path / "runs"), "--cache-dir",
              str(tmp_path / "cache"), "--out-repository", str(tmp_path / "models")]
    first = subprocess.run([sys.executable, "-m", "training", *common, "--stop-at", "1"],
                           cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    line = train_refusal(tmp_path, "--data", "c.txt", "--resume", "--n-embd", "16",
                         "--block-size", "8")
    state = tmp_path / "runs" / "default" / "state" / "trainer.pt"
    assert line == (f"--resume: {state} was trained with --n-embd 32 (this run: 16), "
                    f"--block-size 16 (this run: 8); resume with the run's own model flags, "
                    f"or start fresh without --resume")


def test_corpus_too_small(tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text("hi")
    line = train_refusal(tmp_path, "--data", "c.txt")
    assert line.startswith("--data: the corpus is too small: ")
    assert "at --val-fraction 0.1 (need >= 2 each); give more text" in line


def test_jsonl_line_without_text(tmp_path: Path) -> None:
    (tmp_path / "c.jsonl").write_text('{"text": "fine"}\n{"body": "x"}\n')
    line = train_refusal(tmp_path, "--data", "c.jsonl")
    assert line == ("c.jsonl:2: need a JSON object with a 'text' field, one per line, in "
                    "UTF-8")


def test_jsonl_that_is_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "c.jsonl").write_bytes(b'{"text": "caf\xe9"}\n')
    line = train_refusal(tmp_path, "--data", "c.jsonl")
    assert line.startswith("c.jsonl:1: need a JSON object")


def test_device_that_is_not_there(tmp_path: Path) -> None:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    spec = f"cuda:{count}"
    line = train_refusal(tmp_path, "--device", spec)
    assert line.startswith(f"--device {spec}: torch sees {count} CUDA device(s) here")


def test_bad_flag_and_environment_values(tmp_path: Path) -> None:
    assert train_refusal(tmp_path, "--batch-size", "6", "--grad-accum", "4") == (
        "--batch-size 6 is not divisible by --grad-accum 4 (see --help)")
    assert train_refusal(tmp_path, env={"EMBED_TRAIN_MAX_STEPS": "ten"}) == (
        "EMBED_TRAIN_MAX_STEPS: must be a number of steps >= 1, got 'ten' (see --help)")


def test_out_repository_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "models").write_text("")
    line = refusal("training", *TINY, "--out-repository", "models", cwd=tmp_path,
                   env={"EMBED_TRAIN_RUNS_DIR": str(tmp_path / "runs")})
    assert line == ("python -m training: error: --out-repository models: is a file, not a "
                    "directory")


@pytest.mark.parametrize(("name", "content", "expected"), [
    ("config.json", '{"model_type": "gpt2",', "not valid JSON (Expecting"),
    ("config.json", "[1, 2]", "holds a JSON list, not an object"),
    ("config.json", b"{\"model_type\": \"\xff\"}", "not UTF-8 text (byte 16)"),
    ("model.safetensors.index.json", "{oops}", "not valid JSON (Expecting property name"),
    ("tokenizer_config.json", "", "not valid JSON (Expecting value at line 1 column 1)"),
])
def test_importer_names_the_file_with_bad_json(tmp_path: Path, name: str,
                                               content: str | bytes, expected: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    good = {"config.json": '{"model_type": "gpt2"}',
            "model.safetensors.index.json": '{"weight_map": {}}'}
    for file, text in good.items():
        if name == "tokenizer_config.json" and file == "model.safetensors.index.json":
            continue
        (src / file).write_text(text)
    if name == "tokenizer_config.json":  # read only next to a tokenizer.json
        _tiny_safetensors(src)
        (src / "tokenizer.json").write_text(_TOKENIZER_JSON)
    path = src / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    out = tmp_path / "models" / "m" / "1"
    line = refusal("training.importers", "hf", str(src), "--out", str(out), cwd=tmp_path)
    assert line.startswith(f"python -m training.importers: error: {path}: {expected}"), line


def _tiny_safetensors(src: Path) -> None:
    from safetensors.torch import save_file

    save_file({"transformer.wte.weight": torch.zeros(8, 4),
               "transformer.wpe.weight": torch.zeros(4, 4)}, str(src / "model.safetensors"))
    (src / "config.json").write_text('{"model_type": "gpt2", "vocab_size": 8, "n_embd": 4, '
                                     '"n_positions": 4}')


# A minimal tokenizer.json the tokenizers library reads (word level, two tokens).
_TOKENIZER_JSON = ('{"version": "1.0", "truncation": null, "padding": null, "added_tokens": '
                   '[], "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, '
                   '"post_processor": null, "decoder": null, "model": {"type": "WordLevel", '
                   '"vocab": {"a": 0, "[UNK]": 1}, "unk_token": "[UNK]"}}')


def _with_bars(tmp_path: Path, *args: str, file_limit: int | None = None
               ) -> subprocess.CompletedProcess[str]:
    """The job with its progress bars on (tqdm, as a person sees it), ``file_limit``
    bytes the most any file may grow to (a disk that fills: writes fail with EFBIG)."""
    flags = [a for a in TINY if a != "--no-progress"]

    def limit() -> None:
        if file_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails, not the process
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    return subprocess.run(
        [sys.executable, "-m", "training", *flags, "--runs-dir", str(tmp_path / "runs"),
         "--cache-dir", str(tmp_path / "cache"), "--out-repository", str(tmp_path / "models"),
         *args], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=300, preexec_fn=limit)


def test_a_refusal_during_tokenizing_starts_its_own_line(tmp_path: Path) -> None:
    """Before: 'tokenize: 0.00tok [00:00, ?tok/s]python -m training: error: ...'."""
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n')
    proc = _with_bars(tmp_path, "--data", "bad.jsonl")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[-1] == ("python -m training: error: bad.jsonl:1: need a JSON object with a "
                         "'text' field, one per line, in UTF-8")
    assert lines[-2].endswith("tokenize: 0.00tok [00:00, ?tok/s]"), lines  # the bar, ended
    assert proc.stderr.count("python -m training") == 1


def test_a_full_disk_during_training_is_one_line_after_the_bar(tmp_path: Path) -> None:
    """The trainer state cannot be written (every file limited to 1 MiB, the state is
    ~19 MiB): one line naming the file, exit status 1, below the train bar that ended.
    Before: the line was glued to the bar, and said 'internal error (RuntimeError)' (torch's
    zip writer hides the failed write)."""
    (tmp_path / "c.txt").write_text(corpus_text())
    proc = _with_bars(tmp_path, "--data", "c.txt", "--checkpoint-every", "1",
                      file_limit=1 << 20)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    state = tmp_path / "runs" / "default" / "state" / "trainer.pt"
    assert lines[-1] == f"python -m training: {state}: File too large"
    assert lines[-2].startswith("train:  50%|"), lines  # step 1 of 2, where it was saved
    assert "val=-" in lines[-2]  # no evaluation yet: not 'val=nan'
    assert not state.exists()
    assert list(state.parent.iterdir()) == []  # its temporary file removed


def test_a_full_disk_while_tokenizing_names_the_token_shard(tmp_path: Path) -> None:
    """Before: 'python -m training: 4001 requested and 1000 written' (numpy's tofile)."""
    (tmp_path / "c.txt").write_text(corpus_text())
    proc = _with_bars(tmp_path, "--data", "c.txt", file_limit=2000)
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.splitlines()[-1]
    assert re.fullmatch(rf"python -m training: {re.escape(str(tmp_path / 'cache'))}/"
                        r"[0-9a-f]{64}/tokens\.bin: File too large", line), line
    assert list((tmp_path / "cache").iterdir()) == []  # the half-written shard removed
