"""Hostile and malformed files through every loader: the importers (an HF directory, a
nanoGPT ckpt.pt, a --tokenizer file), the checkpoint and tokenizer loaders and the
repository scan. Each refusal is one line in the project's words: never a traceback, an
exception's repr, a source excerpt, or a library's advice to weaken a safety setting
(``trust_remote_code=True``, ``weights_only=False``, "disable verification" ...)."""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from service.engine.repository import Repository, load_model
from service.format.checkpoint import read_checkpoint
from tests.hf_models import build, save
from training.importers import main

# Advice a library gives that would weaken a safety setting, in the forms it is written.
WEAKENING = ("trust_remote_code", "remote code", "custom code", "run the custom",
             "weights_only=false", "weights_only` set to `false", "weights_only set to false",
             "weights_only` to `false", "disable verification", "verify=false", "insecure",
             "--no-verify", "allow_pickle", "unsafe", "skip verification", "disable ssl",
             "ssl_verify", "safe_serialization=false", "hf_hub_disable")
_REPR = re.compile(r"\b\w*(Error|Exception|Warning)\(|Traceback|File \"|\^\^\^|line \d+, in ")


def assert_safe_message(message: str) -> None:
    """One line, no traceback or exception repr or source excerpt, no weakening advice."""
    text = message.rstrip("\n")
    assert "\n" not in text, f"more than one line: {message!r}"
    assert _REPR.search(text) is None, f"a traceback, repr or excerpt: {message!r}"
    low = text.lower()
    found = [phrase for phrase in WEAKENING if phrase in low]
    assert not found, f"{found} in {message!r}"


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one stderr line of an importer refusal (exit 2, nothing on stdout)."""
    try:
        status = main(argv)
    except SystemExit as e:
        status = int(e.code or 0)
    captured = capsys.readouterr()
    assert status == 2, captured.err
    assert captured.out == ""
    assert_safe_message(captured.err)
    return captured.err.strip()


def _llama_dir(tmp: Path) -> Path:
    return save(build("llama"), tmp / "src")


_HF_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "config not JSON": (lambda d: (d / "config.json").write_text("<html>404</html>"),
                        "config.json: not valid JSON (Expecting value at line 1 column 1)"),
    "config a list": (lambda d: (d / "config.json").write_text("[1]"),
                      "config.json: holds a JSON list, not an object"),
    "safetensors garbage": (lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 40),
                            "model.safetensors: cannot be read as safetensors ("),
    "safetensors huge header": (
        lambda d: (d / "model.safetensors").write_bytes((1 << 60).to_bytes(8, "little")),
        "model.safetensors: cannot be read as safetensors ("),
    "shard outside the directory": (
        lambda d: ((d / "model.safetensors").rename(d / "shard.safetensors"),
                   (d / "model.safetensors.index.json").write_text(json.dumps(
                       {"weight_map": {"model.embed_tokens.weight": "../shard.safetensors"}}))),
        'model.safetensors.index.json: weight_map["model.embed_tokens.weight"] is '
        '"../shard.safetensors": a shard must be a file name in'),
    "absolute shard": (
        lambda d: ((d / "model.safetensors").unlink(),
                   (d / "model.safetensors.index.json").write_text(json.dumps(
                       {"weight_map": {"model.embed_tokens.weight": "/etc/passwd"}}))),
        'weight_map["model.embed_tokens.weight"] is "/etc/passwd": a shard must be'),
    "missing shard": (
        lambda d: ((d / "model.safetensors").unlink(),
                   (d / "model.safetensors.index.json").write_text(json.dumps(
                       {"weight_map": {"model.embed_tokens.weight": "gone.safetensors"}}))),
        "gone.safetensors: cannot be read as safetensors ("),
    "only a pickle": (
        lambda d: ((d / "model.safetensors").unlink(),
                   (d / "pytorch_model.bin").write_bytes(pickle.dumps({"a": 1}))),
        "no model.safetensors or model.safetensors.index.json (found pytorch_model.bin: "
        "pickled weights are never opened)"),
    "tokenizer.json garbage": (lambda d: (d / "tokenizer.json").write_text('{"model": 7}'),
                               "tokenizer.json: not a tokenizer.json the tokenizers library "
                               "reads ("),
    "tokenizer.model garbage": (
        lambda d: (d / "tokenizer.model").write_bytes(b"\x0agarbage\xff" * 10),
        "tokenizer.model: AutoTokenizer could not load it"),
    "tokenizer_config auto_map": (
        lambda d: ((d / "tokenizer.json").write_text(_TOKENIZER_JSON),
                   (d / "tokenizer_config.json").write_text(json.dumps(
                       {"auto_map": {"AutoTokenizer": ["x.Y", None]}}))),
        "tokenizer_config.json: auto_map names Python code to import"),
    "unknown model_type": (
        lambda d: (d / "config.json").write_text(json.dumps(
            {**json.loads((d / "config.json").read_text()), "model_type": "nothing-known"})),
        "model_type 'nothing-known' has no hand-written entry"),
    "sizes that are not numbers": (
        lambda d: (d / "config.json").write_text(json.dumps(
            {**json.loads((d / "config.json").read_text()), "vocab_size": "many"})),
        "config.json: no integer vocab_size"),
}
_TOKENIZER_JSON = ('{"version": "1.0", "truncation": null, "padding": null, "added_tokens": '
                   '[], "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, '
                   '"post_processor": null, "decoder": null, "model": {"type": "WordLevel", '
                   '"vocab": {"a": 0, "[UNK]": 1}, "unk_token": "[UNK]"}}')


@pytest.mark.parametrize("case", list(_HF_CASES))
def test_hf_directory(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    src = _llama_dir(tmp_path)
    damage, expected = _HF_CASES[case]
    damage(src)
    capsys.readouterr()
    out = tmp_path / "models" / "m" / "1"
    line = _refused(["hf", str(src), "--out", str(out)], capsys)
    assert line.startswith("python -m training.importers: error: "), line
    assert expected in line, line
    assert not out.parent.exists()


class _Payload:
    """Not a tensor: weights_only refuses to unpickle it."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (print, ("never printed",))


@pytest.mark.parametrize(("case", "expected"), [
    ("code in the pickle", "holds Python objects besides tensors and plain containers "
                           "(print): refused; a checkpoint is read as data, never "
                           "as code"),
    ("old pickle format", "holds Python objects besides tensors and plain containers: "
                          "refused; a checkpoint is read as data, never as code"),
    ("truncated", "not a checkpoint torch.save wrote, or a damaged one (PytorchStreamReader "
                  "failed reading zip archive"),
    ("text", "not a checkpoint torch.save wrote, or a damaged one"),
])
def test_nanogpt_ckpt(tmp_path: Path, case: str, expected: str,
                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ckpt.pt"
    if case == "code in the pickle":
        torch.save({"model": {}, "model_args": {}, "payload": _Payload()}, path)
    elif case == "old pickle format":
        path.write_bytes(pickle.dumps({"model": _Payload()}, protocol=4))
    elif case == "truncated":
        torch.save({"model": {"w": torch.zeros(4)}}, path)
        path.write_bytes(path.read_bytes()[:60])
    else:
        path.write_text("hello")
    line = _refused(["nanogpt", str(path), "--out", str(tmp_path / "models" / "m" / "1")],
                    capsys)
    assert line.startswith(f"python -m training.importers: error: {path}: {expected}"), line


def test_tiktoken_file_that_is_not_one(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    src = _llama_dir(tmp_path)
    ranks = tmp_path / "ranks.tiktoken"
    ranks.write_text("this is not base64 and a rank\n")
    capsys.readouterr()
    line = _refused(["hf", str(src), "--tokenizer", str(ranks), "--out",
                     str(tmp_path / "models" / "m" / "1")], capsys)
    assert line.startswith(f"python -m training.importers: error: {ranks}: not a tiktoken "
                           f"ranks file this importer can "
                           f"read ("), line


def _good_version(tmp: Path) -> Path:
    """A version imported from a tiny Llama with a tokenizer.json."""
    src = _llama_dir(tmp)
    (src / "tokenizer.json").write_text(_TOKENIZER_JSON)
    version = tmp / "models" / "m" / "1"
    assert main(["hf", str(src), "--out", str(version)]) == 0
    return version


def _rehash(version: Path, name: str) -> None:
    """Make the manifest list a damaged file's own sha256, so its content is parsed."""
    manifest = json.loads((version / "manifest.json").read_text())
    digest = hashlib.sha256((version / name).read_bytes()).hexdigest()
    manifest["files"][name] = digest
    if manifest.get("tokenizer") and manifest["tokenizer"]["file"] == name:
        manifest["tokenizer"]["sha256"] = digest
    (version / "manifest.json").write_text(json.dumps(manifest))


_VERSION_CASES: dict[str, Callable[[Path], None]] = {
    "manifest not JSON": lambda v: (v / "manifest.json").write_text("{"),
    "manifest unknown rule": lambda v: (v / "manifest.json").write_text(json.dumps(
        {**json.loads((v / "manifest.json").read_text()), "rules": {"run_code": True}})),
    "embeddings garbage": lambda v: ((v / "embeddings.safetensors").write_bytes(b"\x07" * 64),
                                     _rehash(v, "embeddings.safetensors")),
    "embeddings a pickle": lambda v: ((v / "embeddings.safetensors").write_bytes(
        pickle.dumps({"token_embedding": 1})), _rehash(v, "embeddings.safetensors")),
    "tokenizer garbage": lambda v: ((v / "tokenizer.json").write_text('{"model": []}'),
                                    _rehash(v, "tokenizer.json")),
    "a rule tensor missing": lambda v: (
        save_file({"token_embedding": torch.zeros(96, 24)},
                  str(v / "embeddings.safetensors"), metadata={"format": "x"}),
        (v / "manifest.json").write_text(json.dumps(
            {**json.loads((v / "manifest.json").read_text()),
             "rules": {"layernorm": {"eps": 1e-5}}})),
        _rehash(v, "embeddings.safetensors")),
    "a rule tensor of the wrong shape": lambda v: (
        save_file({"token_embedding": torch.zeros(96, 24), "layernorm_weight": torch.ones(5),
                   "layernorm_bias": torch.zeros(24)},
                  str(v / "embeddings.safetensors"), metadata={"format": "x"}),
        (v / "manifest.json").write_text(json.dumps(
            {**json.loads((v / "manifest.json").read_text()),
             "rules": {"layernorm": {"eps": 1e-5}}})),
        _rehash(v, "embeddings.safetensors")),
    "code beside it": lambda v: (v / "modeling_evil.py").write_text("raise SystemExit"),
}


@pytest.mark.parametrize("case", list(_VERSION_CASES))
def test_checkpoint_tokenizer_and_repository_scan(tmp_path: Path, case: str) -> None:
    version = _good_version(tmp_path)
    _VERSION_CASES[case](version)
    messages = []
    for load in (lambda: read_checkpoint(version),
                 lambda: load_model("m", version, torch.device("cpu"), None)):
        try:
            load()
        except Exception as e:  # every loader's refusal, whatever its type
            messages.append(str(e))
    # read_checkpoint does not open the tokenizer; load_model (the scan's) refuses all
    assert len(messages) == (1 if case == "tokenizer garbage" else 2), messages
    for message in messages:
        assert_safe_message(message)
    repo = Repository(version.parent.parent, torch.device("cpu"), None)
    assert repo.refresh() == []
    [(model, number, state, reason)] = repo.index()
    assert (model, number, state) == ("m", 1, "UNAVAILABLE")
    assert reason
    assert_safe_message(reason)
    shutil.rmtree(version)


def test_library_advice_never_reaches_a_message(tmp_path: Path) -> None:
    """``reason``, the one way a library's exception enters our messages, keeps neither
    torch's nor transformers' advice to weaken a safety setting, nor a source excerpt."""
    import transformers

    from training.importers.source import reason

    path = tmp_path / "evil.pt"
    torch.save({"payload": _Payload()}, path)
    with pytest.raises(pickle.UnpicklingError) as torch_error:
        torch.load(path, weights_only=True)
    assert "weights_only` set to `False" in str(torch_error.value)  # what torch advises
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "config.json").write_text(json.dumps(
        {"model_type": "evilnet", "auto_map": {"AutoConfig": "configuration_x.XConfig"}}))
    with pytest.raises(ValueError) as tf_error:
        transformers.AutoConfig.from_pretrained(str(remote), local_files_only=True,
                                                trust_remote_code=False)
    assert "trust_remote_code=True" in str(tf_error.value)  # what transformers advises
    excerpt = RuntimeError("shapes differ.\n  File \"modeling_x.py\", line 3, in forward\n"
                           "    y = x @ w\n        ^^^^^")
    for e in (torch_error.value, tf_error.value, excerpt):
        assert_safe_message(reason(e))
    assert reason(excerpt) == "shapes differ."
    assert reason(torch_error.value) == "Weights only load failed."
    assert reason(tf_error.value) == f"You can inspect the repository content at {remote} ."
