"""nanoGPT's ``ckpt.pt`` -> ``SourceTables`` (loaded with ``weights_only=True``).

A ``ckpt.pt`` is a pickle by nature; ``torch.load(weights_only=True)`` refuses anything but
tensors and plain containers. nanoGPT's ``torch.compile`` prefix ``_orig_mod.`` is stripped.
"""

from __future__ import annotations

import pickle
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from training.importers.source import (
    ImporterError,
    SourceTables,
    check_shape,
    config_int,
    reason,
    resolve_names,
    sha256_file,
)

__all__ = ["NANOGPT_NAMES", "load_nanogpt"]

NANOGPT_NAMES: dict[str, str] = {
    "transformer.wte.weight": "token_embedding",
    "transformer.wpe.weight": "position_embedding",
}
_TORCH_COMPILE_PREFIX = "_orig_mod."


def _json_scalars(d: Mapping[str, Any]) -> dict[str, Any]:
    """Keep the JSON-safe scalar entries (a train config can hold anything)."""
    return {str(k): v for k, v in d.items() if isinstance(v, str | int | float | bool)}


def load_nanogpt(ckpt_path: Path) -> SourceTables:
    """wte/wpe from nanoGPT's ckpt.pt (weights_only load; torch.compile prefix stripped)."""
    where = str(ckpt_path)
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols on stderr
            warnings.simplefilter("ignore")
            ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # something besides tensors and plain containers
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f" ({found.group(1)})" if found else ""
        raise ImporterError(f"{where}: holds Python objects besides tensors and plain "
                            f"containers{what}: refused; a checkpoint is read as data, "
                            f"never as code") from None
    except Exception as e:  # not a torch.save archive, or a damaged one
        detail = f" ({reason(e)})" if isinstance(e, RuntimeError) else ""
        raise ImporterError(f"{where}: not a checkpoint torch.save wrote, or a damaged one"
                            f"{detail}") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model"), dict):
        raise ImporterError(f"{where}: not a nanoGPT checkpoint (no 'model' state dict)")
    if not isinstance(ckpt.get("model_args"), dict):
        raise ImporterError(f"{where}: not a nanoGPT checkpoint (no 'model_args' dict)")
    state = {k.removeprefix(_TORCH_COMPILE_PREFIX): v for k, v in ckpt["model"].items()}
    args: dict[str, Any] = ckpt["model_args"]
    names = resolve_names(list(state), NANOGPT_NAMES,
                          ["token_embedding", "position_embedding"], where)
    table_rows = config_int(args, ["vocab_size"], f"{where} model_args")
    n_embd = config_int(args, ["n_embd"], f"{where} model_args")
    block_size = config_int(args, ["block_size"], f"{where} model_args")
    wte, wpe = names["token_embedding"], names["position_embedding"]
    check_shape(where, wte, state[wte].shape, (table_rows, n_embd),
                "[vocab_size, n_embd] from model_args")
    check_shape(where, wpe, state[wpe].shape, (block_size, n_embd),
                "[block_size, n_embd] from model_args")
    val_loss = ckpt.get("best_val_loss")
    provenance: dict[str, Any] = {
        "source": "nanogpt", "model_args": _json_scalars(args),
        "train_config": _json_scalars(ckpt.get("config") or {}),
        "source_files": {ckpt_path.name: sha256_file(ckpt_path)}}
    if isinstance(ckpt.get("iter_num"), int):
        provenance["step"] = ckpt["iter_num"]
    if isinstance(val_loss, torch.Tensor | float):  # nanoGPT stores a 0-d tensor
        provenance["val_loss"] = float(val_loss)
    # clone: wte shares storage with the tied lm_head.weight
    return SourceTables(state[wte].clone(), state[wpe].clone(), block_size, names, provenance)
