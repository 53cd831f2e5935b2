"""A model directory is data: its Python files never run, whatever is on standard input.

Each hostile directory below ships ``.py`` files that create a marker file when imported
and names them the ways transformers would load them (``auto_map`` in config.json or
tokenizer_config.json, nested in a ``text_config``, a ``tokenizer_class`` or an
``architectures`` entry that is not transformers' own). Every command that reads a model
directory is run on it with ``y``, ``yes`` and a closed standard input: the marker never
appears, the exit status is not 0, and the refusal is one line naming the file and the
key, with none of the phrases that advise weakening a safety setting. A version directory
carrying the same files is served (the server reads only its manifest's files) and the
marker still never appears."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from service.engine.repository import Repository
from tests.hf_models import build, save
from tests.training.importers.test_hostile_files import assert_safe_message
from training.importers import hf as hf_module
from training.importers import main
from training.importers import reference as reference_module
from training.importers import tokenizer_json as tokenizer_json_module
from training.importers.reference import Reference
from training.importers.source import ImporterError, SafetensorsDir
from training.importers.spm_tokenizer import convert
from training.importers.tokenizer_json import resolve

ROOT = Path(__file__).resolve().parents[3]
STDINS = {"y": "y\n", "yes": "yes\n", "closed": None}
# Each hostile layout: (files it adds or changes, the one line's expected start after the
# directory, i.e. "<file>: <key> ...").
_EVIL_MAP = {"AutoConfig": "configuration_evil.EvilConfig",
             "AutoModel": "modeling_evil.EvilModel",
             "AutoModelForCausalLM": "modeling_evil.EvilModel"}
_TOKENIZER_MAP = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}


def _python(marker: Path, name: str) -> str:
    """A module that leaves a marker when imported (and looks like transformers code)."""
    return (f"import pathlib\npathlib.Path({str(marker / name)!r}).write_text('ran')\n"
            f"from transformers import PretrainedConfig, PreTrainedModel\n"
            f"class EvilConfig(PretrainedConfig):\n    model_type = 'llama'\n"
            f"class EvilModel(PreTrainedModel):\n    config_class = EvilConfig\n"
            f"class EvilTokenizer:\n    pass\n")


def _tokenizer_files(src: Path) -> None:
    """A real tokenizer.json (word level), so the tokenizer path is taken."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1, "b": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(src / "tokenizer.json"))


def _edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text()) if path.is_file() else {}
    change(data)
    path.write_text(json.dumps(data))


def _hostile(tmp: Path, kind: str) -> tuple[Path, Path, str]:
    """(model directory, marker directory, expected line start) for one layout."""
    marker = tmp / "markers"
    marker.mkdir(parents=True, exist_ok=True)
    src = tmp / kind
    family = "qwen3" if kind in ("config-unknown-type", "nested") else "llama"
    save(build(family), src)
    _tokenizer_files(src)
    for name in ("configuration_evil.py", "modeling_evil.py", "tokenization_evil.py",
                 "__init__.py"):
        (src / name).write_text(_python(marker, name))
    config, tok_config = src / "config.json", src / "tokenizer_config.json"
    _edit(tok_config, lambda d: d.update({"tokenizer_class": "PreTrainedTokenizerFast"}))
    if kind == "config-auto-map":  # a hand-written family (llama) with code of its own
        _edit(config, lambda d: d.update({"auto_map": _EVIL_MAP}))
        expected = f"{config}: auto_map names Python code to import"
    elif kind == "config-unknown-type":  # discovery's path: AutoConfig would import it
        _edit(config, lambda d: d.update({"auto_map": _EVIL_MAP, "model_type": "evilnet"}))
        expected = f"{config}: auto_map names Python code to import"
    elif kind == "nested":
        _edit(config, lambda d: d.update({"text_config": {"auto_map": _EVIL_MAP}}))
        expected = f"{config}: text_config.auto_map names Python code to import"
    elif kind == "tokenizer-auto-map":
        _edit(tok_config, lambda d: d.update({"auto_map": _TOKENIZER_MAP}))
        expected = f"{tok_config}: auto_map names Python code to import"
    elif kind == "tokenizer-class":
        _edit(tok_config, lambda d: d.update({"tokenizer_class": "EvilTokenizer"}))
        expected = f"{tok_config}: tokenizer_class names 'EvilTokenizer', which is not a class"
    elif kind == "architectures":
        _edit(config, lambda d: d.update({"architectures": ["EvilModel"]}))
        expected = f"{config}: architectures names 'EvilModel', which is not a class"
    else:
        raise AssertionError(kind)
    return src, marker, expected


KINDS = ("config-auto-map", "config-unknown-type", "nested", "tokenizer-auto-map",
         "tokenizer-class", "architectures")
# Every importer subcommand and the flags that take another path through the code.
COMMANDS = [["hf"], ["hf", "--discover"], ["hf", "--name-map-check"],
            ["hf", "--no-tokenizer"], ["hf-llama"], ["hf-gpt2"]]


def _argv(command: list[str], src: Path, out: Path) -> list[str]:
    argv = [command[0], str(src), *command[1:]]
    return argv if "--name-map-check" in command else [*argv, "--out", str(out)]


def _assert_refused(err: str, expected: str, marker: Path, out: Path) -> None:
    assert list(marker.iterdir()) == [], "a file of the model directory ran"
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"python -m training.importers: error: {expected}"), lines[0]
    assert lines[0].endswith("refused; files in a model directory are data and are never run")
    assert_safe_message(lines[0])
    assert not out.parent.exists()


@pytest.mark.parametrize("kind", KINDS)
def test_every_importer_refuses_in_process(tmp_path: Path, kind: str,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    src, marker, expected = _hostile(tmp_path, kind)
    capsys.readouterr()  # save_pretrained's progress
    for command in COMMANDS:
        for name, text in STDINS.items():
            stdin = io.StringIO(text or "")
            if text is None:
                stdin.close()
            monkeypatch.setattr(sys, "stdin", stdin)
            out = tmp_path / "models" / "m" / "1"
            assert main(_argv(command, src, out)) == 2, (command, name)
            captured = capsys.readouterr()
            assert captured.out == ""
            _assert_refused(captured.err, expected, marker, out)


@pytest.mark.parametrize("stdin", list(STDINS))
def test_a_real_process_with_an_answer_on_stdin(tmp_path: Path, stdin: str) -> None:
    """As a user would run it: the answer on a real standard input, or none at all."""
    src, marker, expected = _hostile(tmp_path, "config-unknown-type")
    out = tmp_path / "models" / "m" / "1"
    proc = subprocess.run(
        [sys.executable, "-m", "training.importers", "hf", str(src), "--out", str(out)],
        input=STDINS[stdin], stdin=subprocess.DEVNULL if STDINS[stdin] is None else None,
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert "Do you wish to run" not in proc.stderr
    _assert_refused(proc.stderr, expected, marker, out)


def test_nanogpt_given_the_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    src, marker, _ = _hostile(tmp_path, "config-auto-map")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["nanogpt", str(src), "--out", str(tmp_path / "models" / "m" / "1")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err == (f"python -m training.importers: error: CKPT {src}: not a file; "
                   f"accepts an existing file (nanoGPT's ckpt.pt) (see --help)\n")
    assert list(marker.iterdir()) == []


@pytest.mark.parametrize("kind", ["config-unknown-type", "tokenizer-auto-map"])
def test_each_entry_point_refuses_on_its_own(tmp_path: Path, kind: str) -> None:
    """Reference (AutoConfig, AutoModel), resolve (AutoTokenizer) and convert (the
    SentencePiece conversion) each refuse before transformers reads the directory, even
    when called without load_hf's own check."""
    src, marker, expected = _hostile(tmp_path, kind)
    spm = tmp_path / "spm"
    spm.mkdir()
    for name in ("config.json", "tokenizer_config.json", "tokenization_evil.py"):
        (spm / name).write_bytes((src / name).read_bytes())
    (spm / "tokenizer.model").write_bytes(b"not read: refused first")
    calls: list[tuple[Callable[[], Any], str]] = [
        (lambda: resolve(src, "llama"), expected),
        (lambda: convert(spm, "llama"), expected.replace(str(src), str(spm)))]
    if kind == "config-unknown-type":
        calls.append((lambda: Reference(SafetensorsDir(src), torch.float32), expected))
    for call, start in calls:
        with pytest.raises(ImporterError) as e:
            call()
        assert str(e.value).startswith(start), str(e.value)
        assert_safe_message(str(e.value))
    assert list(marker.iterdir()) == []


@pytest.mark.parametrize("kind", ["config-unknown-type", "tokenizer-auto-map"])
def test_without_the_check_nothing_runs_either(tmp_path: Path, kind: str,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Defence in depth: with the JSON check switched off, transformers is still called
    offline with remote code refused, no answer is read, and nothing of the directory
    runs; what reaches the user carries none of transformers' advice."""
    # tokenizer_json's check is the SentencePiece converter's too (auto_tokenizer)
    for module in (hf_module, reference_module, tokenizer_json_module):
        monkeypatch.setattr(module, "refuse_custom_code", lambda model_dir: None)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    src, marker, _ = _hostile(tmp_path, kind)
    capsys.readouterr()
    status = main(["hf", str(src), "--out", str(tmp_path / "models" / "m" / "1")])
    captured = capsys.readouterr()
    assert list(marker.iterdir()) == []
    assert "Do you wish to run" not in captured.out + captured.err
    for line in captured.err.splitlines():
        assert_safe_message(line)
    if kind == "config-unknown-type":  # AutoConfig refuses: so does the import
        assert status == 2
        assert len(captured.err.splitlines()) == 1
    else:  # AutoTokenizer refuses: the emulated tokenizer.json stands, and nothing ran
        assert status == 0


def test_repository_scan_and_inspect_refuse_the_version(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A version directory carrying a model directory's code and JSON files: the scan
    refuses it (a version holds exactly its manifest's files) in one line, and
    training.inspect likewise; the marker never appears."""
    clean = save(build("llama"), tmp_path / "clean")
    _tokenizer_files(clean)
    root = tmp_path / "models"
    version = root / "m" / "1"
    assert main(["hf", str(clean), "--out", str(version)]) == 0
    hostile, marker, _ = _hostile(tmp_path, "config-unknown-type")
    for name in ("configuration_evil.py", "modeling_evil.py", "tokenization_evil.py",
                 "__init__.py"):
        (version / name).write_bytes((hostile / name).read_bytes())
    repo = Repository(root, torch.device("cpu"), None)
    assert repo.refresh() == []
    reason = repo.index()[0][3]
    assert reason.endswith("'__init__.py' is not listed in the manifest (4 such files)"), reason
    assert_safe_message(reason)
    from training.inspect import main as inspect_main

    capsys.readouterr()
    assert inspect_main(["--model-repository", str(root), "--model", "m", "neighbors",
                         "--id", "1", "--k", "2"]) != 0
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert_safe_message(err)
    assert list(marker.iterdir()) == []
