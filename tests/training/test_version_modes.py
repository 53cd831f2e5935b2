"""Every file of a written version is 0644 and every directory 0755, whatever the writer's
umask and safetensors' own file mode: the server runs as another uid than the writer (the
image's 10001, a training pod, a CI job), so a version only its writer can read is useless.
write_checkpoint is the one writer; the importers and the training export go through it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from service.format.tokenizer import default_ranks_path, gpt2_spec
from service.format.writer import DIR_MODE, FILE_MODE, write_checkpoint
from tests.deploy.image_check import umask
from tests.training.conftest import MakeConfig
from tests.training.importers.test_importers import _nanogpt_ckpt
from training.data import load_tokens
from training.export import export_model
from training.importers import main as importers_main
from training.train import train


def _modes(root: Path) -> dict[str, int]:
    """Permission bits of ``root`` and everything under it, by relative path."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


def _assert_readable_by_all(repository: Path) -> None:
    modes = _modes(repository)
    files = {k: v for k, v in modes.items() if (repository / k).is_file()}
    dirs = {k: v for k, v in modes.items() if (repository / k).is_dir()}
    assert any(k.endswith(".safetensors") for k in files), modes
    assert files == dict.fromkeys(files, FILE_MODE), modes
    assert dirs == dict.fromkeys(dirs, DIR_MODE), modes


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_write_checkpoint_modes(tmp_path: Path, mask: int) -> None:
    repository = tmp_path / "models"  # created by write_checkpoint, like every parent
    with umask(mask):
        write_checkpoint(repository / "m" / "1", token_table=torch.zeros(50257, 4),
                         position="learned", max_seq_len=8, vocab_size=50257,
                         tokenizer_spec=gpt2_spec(), tokenizer_ranks=default_ranks_path(),
                         position_table=torch.zeros(8, 4),
                         row_updates=torch.zeros(50257, dtype=torch.int64),
                         model_tensors={"ln_f.weight": torch.ones(4)})
    assert sorted(p.name for p in (repository / "m" / "1").iterdir()) == [
        "embeddings.safetensors", "manifest.json", "model.safetensors",
        "row_updates.safetensors", "tokenizer.tiktoken"]
    _assert_readable_by_all(repository)


def test_existing_parent_modes_are_left_alone(tmp_path: Path) -> None:
    """Directories the writer did not create keep the modes their owner chose."""
    repository = tmp_path / "models"
    repository.mkdir(mode=0o750)
    os.chmod(repository, 0o750)
    with umask(0o077):
        write_checkpoint(repository / "m" / "1", token_table=torch.zeros(50257, 4),
                         position="none", max_seq_len=8, vocab_size=50257,
                         tokenizer_spec=gpt2_spec(), tokenizer_ranks=default_ranks_path())
    assert stat.S_IMODE(repository.stat().st_mode) == 0o750
    _assert_readable_by_all(repository / "m")


def test_training_export_modes(make_config: MakeConfig, tokenizer: object,
                               tmp_path: Path) -> None:
    cfg = make_config(max_steps=2, eval_every=2)
    data = load_tokens(cfg.data, tokenizer, Path(cfg.cache_dir), cfg.val_fraction,  # type: ignore[arg-type]
                       progress=False)
    result = train(cfg, tokenizer, data)  # type: ignore[arg-type]
    with umask(0o077):
        version_dir, _ = export_model(result, cfg, gpt2_spec(), default_ranks_path(), 50257)
    assert version_dir.parent.parent == Path(cfg.out_repository)
    _assert_readable_by_all(Path(cfg.out_repository))


def test_importer_modes(tmp_path: Path) -> None:
    src = tmp_path / "ckpt.pt"
    _nanogpt_ckpt(src)
    repository = tmp_path / "models"
    with umask(0o077):
        assert importers_main(["nanogpt", str(src), "--out", str(repository / "nano" / "1")]) == 0
    _assert_readable_by_all(repository)


def test_safetensors_own_mode_is_overridden(tmp_path: Path) -> None:
    """The reason write_checkpoint chmods: what safetensors writes is not 0644 under 077."""
    with umask(0o077):
        save_file({"x": torch.zeros(1)}, str(tmp_path / "x.safetensors"))
    assert stat.S_IMODE((tmp_path / "x.safetensors").stat().st_mode) & 0o044 == 0
