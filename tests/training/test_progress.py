"""The training job without its extras: plain-text progress without tqdm, no plots without
matplotlib, and ``make run``'s first start (training.default_model) works with neither."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from training import plot, progress
from training.progress import TextProgress, progress_bar

REPO_ROOT = Path(__file__).resolve().parents[2]
# What the runtime environment lacks: a None in sys.modules makes the import fail.
_WITHOUT_EXTRAS = "import sys; sys.modules['tqdm'] = None; sys.modules['matplotlib'] = None; "


def test_text_progress_writes_tqdms_words(capsys: pytest.CaptureFixture[str]) -> None:
    bar = TextProgress("train", total=4, initial=1, unit="step", interval=0.0)
    bar.set_postfix(loss="3.100", val="nan")
    bar.update(1)
    bar.update(2)
    bar.close()
    bar.close()  # once only
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("train: 50% 2/4 step [")
    assert lines[-1].startswith("train: 100% 4/4 step [")
    assert lines[-1].endswith(", loss=3.100, val=nan")


def _fail_in(bar: progress.Progress) -> None:
    with bar:
        bar.update(3)
        raise ValueError("bad line")


def test_a_bar_used_with_with_ends_its_line_when_the_work_fails(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="bad line"):
        _fail_in(TextProgress("tokenize", unit="tok", interval=3600.0))
    assert capsys.readouterr().err.startswith("tokenize: 3 tok [")
    with pytest.raises(ValueError, match="bad line"):
        _fail_in(progress_bar("tokenize", unit="tok"))  # tqdm's bar
    err = capsys.readouterr().err
    assert "tokenize: 3tok [" in err
    assert err.endswith("\n")


def test_text_progress_scales_and_throttles(capsys: pytest.CaptureFixture[str]) -> None:
    bar = TextProgress("tokenize", unit="tok", unit_scale=True, interval=3600.0)
    bar.update(1_500_000)  # inside the interval: nothing written yet
    assert capsys.readouterr().err == ""
    bar.close()
    assert capsys.readouterr().err.startswith("tokenize: 1.50M tok [")
    quiet = TextProgress("x", total=2, disable=True, interval=0.0)
    quiet.update(2)
    quiet.close()
    assert capsys.readouterr().err == ""


def test_progress_bar_falls_back_without_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    assert isinstance(progress_bar("train", total=3), progress.TextProgress)


def test_pyplot_says_how_to_get_matplotlib(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(plot.PlotsUnavailable, match=r"\.\[train\]"):
        plot.plot_losses([{"step": 1, "train_loss": 1.0}], 1.0, tmp_path / "loss.png")
    assert not (tmp_path / "loss.png").exists()


def test_default_model_trains_without_the_extras(tmp_path: Path, corpus_file: Path) -> None:
    """``make run``'s first start in the runtime environment: trains, exports, no plot."""
    argv = ["--model-repository", str(tmp_path / "models"), "--data", str(corpus_file),
            "--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "16",
            "--batch-size", "2", "--max-steps", "2", "--eval-every", "2", "--threads", "1",
            "--cache-dir", str(tmp_path / "cache"), "--runs-dir", str(tmp_path / "runs")]
    code = (_WITHOUT_EXTRAS + "from training.default_model import main; "
            f"sys.exit(main({argv!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "train: 100% 2/2 step [" in out.stderr  # plain-text progress
    assert "tokenize: " in out.stderr
    assert "loss curve: none (matplotlib is not installed" in out.stdout
    assert not (tmp_path / "runs" / "default" / "loss.png").exists()
    assert (tmp_path / "models" / "default" / "1" / "manifest.json").is_file()
