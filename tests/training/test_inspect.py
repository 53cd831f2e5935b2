"""training.inspect on real checkpoints written by service.format.checkpoint.write_checkpoint."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from service.format.positions import sinusoidal_table
from service.format.tokenizer import default_ranks_path, gpt2_spec
from service.format.writer import write_checkpoint
from tests.option_rules import check_all, walk
from training.inspect import (
    _parser,
    load_model,
    lookup_figure_size,
    main,
    nearest_tokens,
    parse_args,
    untrained_tokens,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
VOCAB, ROWS, C, MAX_SEQ_LEN = 50257, 50304, 8, 16
THE, CAT = 262, 3797  # GPT-2 ids of " the" and " cat"
UPDATED = [0, 1, THE, CAT, 50256, 50300]  # 50300 is a padding row: never counted
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """models/tiny/1: RoPE, no row_updates; models/tiny/2: learned, row_updates; /3 sinusoidal."""
    root = tmp_path_factory.mktemp("models")
    gen = torch.Generator().manual_seed(0)
    token_table = torch.randn(ROWS, C, generator=gen)  # (table_rows, C)
    token_table[CAT] = token_table[THE]
    token_table[50300] = 2 * token_table[THE]  # same direction, but a padding row
    row_updates = torch.zeros(ROWS, dtype=torch.int64)
    row_updates[UPDATED] = torch.tensor([5, 1, 40, 2, 7, 3])
    common: dict[str, Any] = {
        "token_table": token_table, "max_seq_len": MAX_SEQ_LEN, "vocab_size": VOCAB,
        "tokenizer_spec": gpt2_spec(), "tokenizer_ranks": default_ranks_path()}
    write_checkpoint(root / "tiny" / "1", position="none", **common)
    write_checkpoint(root / "tiny" / "2", position="learned",
                     position_table=torch.randn(MAX_SEQ_LEN, C, generator=gen),
                     row_updates=row_updates, **common)
    write_checkpoint(root / "tiny" / "3", position="sinusoidal", **common)
    return root


def _run(repo: Path, *args: str, version: int = 2) -> list[str]:
    return ["--model-repository", str(repo), "--model", "tiny", "--version", str(version),
            *args]


def test_load_model_newest_and_pinned(repo: Path) -> None:
    assert load_model(repo, "tiny").checkpoint.path.name == "3"
    assert load_model(repo, "tiny", 1).checkpoint.manifest.position == "none"
    assert main(["--model-repository", str(repo), "--model", "tiny", "--version", "9",
                 "untrained"]) == 2
    assert main(["--model-repository", str(repo), "--model", "nope", "untrained"]) == 2


def test_nearest_tokens_equal_row_first(repo: Path) -> None:
    ckpt = load_model(repo, "tiny", 2).checkpoint
    top = nearest_tokens(ckpt.token_table, VOCAB, THE, 5)
    assert len(top) == 5
    assert top[0][0] == CAT
    assert top[0][1] == pytest.approx(1.0, abs=1e-6)
    assert top[1][1] < 0.9999
    assert all(i < VOCAB for i, _ in top)  # the padding row 50300 (also cosine 1) is excluded
    assert THE not in [i for i, _ in top]


def test_neighbors_cli(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_run(repo, "neighbors", " the", "--k", "3")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "nearest to 262 ' the' (cosine, rows < 50257):"
    assert lines[1] == "  1    3797 1.0000 ' cat'"
    assert len(lines) == 4
    assert main(_run(repo, "neighbors", "--id", str(CAT), "--k", "1")) == 0
    assert capsys.readouterr().out.splitlines()[1] == "  1     262 1.0000 ' the'"


def test_neighbors_needs_one_token(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_run(repo, "neighbors", "hello world")) == 2
    assert "'hello world' is 2 tokens [31373, 995], not one" in capsys.readouterr().err


@pytest.mark.parametrize(("token_id", "why"), [
    (VOCAB, " (a padding row, never a token)"), (50300, " (a padding row, never a token)"),
    (ROWS, ""), (99999, "")])
def test_neighbors_id_past_vocab_size(repo: Path, capsys: pytest.CaptureFixture[str],
                                      token_id: int, why: str) -> None:
    assert main(_run(repo, "neighbors", "--id", str(token_id))) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == (f"python -m training.inspect: error: argument --id: must be a token "
                       f"id below the model's vocab_size {VOCAB}, got {token_id}{why}\n")


def test_untrained_exact(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = load_model(repo, "tiny", 2).checkpoint
    ids = untrained_tokens(ckpt.row_updates, VOCAB)
    assert len(ids) == VOCAB - 5
    assert ids[:3].tolist() == [2, 3, 4]
    assert main(_run(repo, "untrained", "--limit", "3")) == 0
    assert capsys.readouterr().out.splitlines() == [
        "50252 of 50257 token rows were never updated in training",
        "      2 '#'", "      3 '$'", "      4 '%'", "... 50249 more (--limit)"]


def test_untrained_without_row_updates(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_run(repo, "untrained", version=1)) == 2
    assert "has no row_updates.safetensors" in capsys.readouterr().err


def test_positions_png(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "positions.png"
    assert main(_run(repo, "positions", "--out", str(out))) == 0
    assert _png_size(out) == (600, 500)
    assert out.stat().st_size > 5_000


def test_positions_sinusoidal_and_none(repo: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    model = load_model(repo, "tiny", 3)
    assert model.position_table is not None
    assert torch.equal(model.position_table, sinusoidal_table(MAX_SEQ_LEN, C))
    assert main(_run(repo, "positions", "--out", str(tmp_path / "s.png"), version=3)) == 0
    assert _png_size(tmp_path / "s.png") == (600, 500)
    assert main(_run(repo, "positions", "--out", str(tmp_path / "n.png"), version=1)) == 2
    assert "no position table" in capsys.readouterr().err
    assert not (tmp_path / "n.png").exists()


def test_lookup_png(repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "lookup.png"
    text = "the cat sat on the mat and then the dog"
    assert main(_run(repo, "lookup", text, "--out", str(out))) == 0
    assert capsys.readouterr().out == f"wrote {out} (T=10, C=8)\n"
    assert lookup_figure_size(10) == (1200, 400)
    assert lookup_figure_size(1024) == (1200, 1800)  # capped: long texts stay viewable
    assert _png_size(out) == (1200, 400)
    assert out.stat().st_size > 10_000


def test_lookup_too_long(repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "lookup.png"
    assert main(_run(repo, "lookup", "a b c", "--start-position", "14", "--out", str(out))) == 2
    assert "text is 3 tokens from position 14" in capsys.readouterr().err
    assert not out.exists()


def test_module_entry_point(repo: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "training.inspect", *_run(repo, "untrained",
                                                                           "--limit", "0")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "50252 of 50257 token rows were never updated in training"


def test_every_option_refuses_what_cannot_work(repo: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    top = "python -m training.inspect: error: "  # a subcommand's mistake too
    name = "a model name: letters, digits, '.', '_' or '-', starting with a letter or digit"
    figure = "a file path ending in .png, .svg or .pdf"

    def bad(command: str, option: str, value: str, accepts: str) -> str:
        return f"{top}argument {option}: must be {accepts}, got {value!r} (see --help)"

    walk(_parser(), {
        "model_repository": [
            (["--model-repository", str(tmp_path / "no"), "--model", "tiny", "untrained"],
             f"{top}--model-repository {tmp_path / 'no'}: does not exist (see --help)"),
            (["--model-repository", str(repo), "--model", "tiny", "untrained"], None)],
        "model": [(["--model-repository", str(repo), "--model", "../x", "untrained"],
                   bad("", "--model", "../x", name)), (_run(repo, "untrained"), None)],
        "version": [(_run(repo, "untrained", version=0),
                     bad("", "--version", "0", "a version >= 1 (default: the newest)")),
                    (_run(repo, "untrained", version=1), None)],
        "word": [(_run(repo, "neighbors", ""), bad("neighbors", "WORD", "",
                                                   "text that is exactly one token")),
                 (_run(repo, "neighbors", " the"), None)],
        "id": [(_run(repo, "neighbors", "--id", "-1"),
                bad("neighbors", "--id", "-1", "a token id >= 0")),
               (_run(repo, "neighbors", "--id", "262"), None)],
        "k": [(_run(repo, "neighbors", "--id", "1", "--k", "0"),
               bad("neighbors", "--k", "0", "a number of tokens >= 1")),
              (_run(repo, "neighbors", "--id", "1", "--k", "1"), None)],
        "out": [(_run(repo, "positions", "--out", str(tmp_path / "p")),
                 bad("positions", "--out", str(tmp_path / "p"), figure)),
                (_run(repo, "lookup", "a", "--out", str(tmp_path / "p.jpg")),
                 bad("lookup", "--out", str(tmp_path / "p.jpg"), figure)),
                (_run(repo, "positions", "--out", str(tmp_path / "no" / "p.png")),
                 f"{top}--out {tmp_path / 'no' / 'p.png'}: the directory {tmp_path / 'no'} "
                 f"does not exist; create it first (see --help)"),
                (_run(repo, "positions", "--out", str(tmp_path / "p.SVG")), None)],
        "text": [(_run(repo, "lookup", ""), bad("lookup", "TEXT", "", "non-empty text")),
                 (_run(repo, "lookup", " "), None)],
        "start_position": [(_run(repo, "lookup", "a", "--start-position", "-1"),
                            bad("lookup", "--start-position", "-1", "a position >= 0")),
                           (_run(repo, "lookup", "a", "--start-position", "3"), None)],
        "limit": [(_run(repo, "untrained", "--limit", "-1"),
                   bad("untrained", "--limit", "-1", "a number of ids to list >= 0")),
                  (_run(repo, "untrained", "--limit", "0"), None)],
    }, parse_args, capsys)
    check_all([(_run(repo, "neighbors"), f"{top}give exactly one of WORD or --id (see --help)"),
               (_run(repo, "neighbors", " the", "--id", "1"),
                f"{top}give exactly one of WORD or --id (see --help)")], parse_args, capsys)


@pytest.mark.parametrize(("name", "magic"), [("p.svg", b"<?xml"), ("p.pdf", b"%PDF"),
                                             ("p.PNG", PNG_MAGIC)])
def test_the_figure_is_written_at_exactly_out_in_its_format(repo: Path, tmp_path: Path,
                                                            name: str, magic: bytes) -> None:
    assert main(_run(repo, "positions", "--out", str(tmp_path / name))) == 0
    assert [p.name for p in tmp_path.iterdir()] == [name]
    assert (tmp_path / name).read_bytes().startswith(magic)
