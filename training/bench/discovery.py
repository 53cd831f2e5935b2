"""Benchmark row: the cost of discovery on a Llama-3-8B-shaped checkpoint.

    .venv/bin/python -m training.bench.discovery [--dir DIR] [--keep] [--vocab-size N]

Writes a random bf16 checkpoint with Llama 3 8B's config (vocab 128,256 x hidden 4,096:
a 1 GiB token table) under ``model_type`` smollm3 (Llama's architecture, no hand-written
entry: the import is discovery alone), sharded as a save_pretrained is (the token table in
the first shard, layer 0's tensors and the final norm in the second, an index json). Then
it runs, each in a fresh process: as the floor, a process that only imports torch and
transformers and reads the token table; discovery alone (``--name-map-check``: the rule
found, the tables read, nothing written); and the import (discovery + writing the
version, ids-only). Reported: wall seconds and peak RSS (that child's own ru_maxrss, from wait4)
of each, beside the table's bytes. The figure the issue sets: peak RSS within the table
plus about 1 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "write_checkpoint_shaped"]

# Llama 3 8B's sizes under model_type smollm3 (the Llama architecture; no hand-written
# entry, so the import takes the discovery path alone).
LLAMA3_8B: dict[str, Any] = {"model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"],
             "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
             "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16",
             "tie_word_embeddings": False}

_FLOOR = """
import sys, torch, transformers
from safetensors import safe_open
with safe_open(sys.argv[1], framework="pt") as f:
    t = f.get_tensor("model.embed_tokens.weight")
print(t.shape)
"""


def write_checkpoint_shaped(out: Path) -> int:
    """The random sharded checkpoint; returns the token table's bytes."""
    import torch  # only in the writing child: the parent stays small (see _child)
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    c: dict[str, Any] = LLAMA3_8B
    V, C, F = int(c["vocab_size"]), int(c["hidden_size"]), int(c["intermediate_size"])
    kv = C // int(c["num_attention_heads"]) * int(c["num_key_value_heads"])
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(V, C, generator=gen, dtype=torch.float32).to(torch.bfloat16)  # (V, C)
    shard1 = "model-00001-of-00002.safetensors"
    save_file({"model.embed_tokens.weight": table}, str(out / shard1))
    table_bytes = table.numel() * table.element_size()
    del table
    layer = {"self_attn.q_proj.weight": (C, C), "self_attn.k_proj.weight": (kv, C),
             "self_attn.v_proj.weight": (kv, C), "self_attn.o_proj.weight": (C, C),
             "mlp.gate_proj.weight": (F, C), "mlp.up_proj.weight": (F, C),
             "mlp.down_proj.weight": (C, F), "input_layernorm.weight": (C,),
             "post_attention_layernorm.weight": (C,)}
    shard2 = "model-00002-of-00002.safetensors"
    rest = {f"model.layers.0.{k}": torch.randn(*s, generator=gen).to(torch.bfloat16)
            for k, s in layer.items()}
    rest["model.norm.weight"] = torch.ones(C, dtype=torch.bfloat16)
    save_file(rest, str(out / shard2))
    weight_map = {"model.embed_tokens.weight": shard1, **dict.fromkeys(rest, shard2)}
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(c))
    return table_bytes


def _child(argv: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak RSS bytes, exit status) of one fresh process. Linux carries a
    process's peak RSS across fork and exec into the child's ru_maxrss, so the parent
    never holds the table itself: a child writes the checkpoint."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak, not all children's
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        print(err.decode(errors="replace")[-2000:], file=sys.stderr)
    return wall, usage.ru_maxrss * 1024, proc.returncode  # ru_maxrss is in KiB


def main(argv: list[str] | None = None) -> int:
    """Write the checkpoint, time the floor and the discovery import, print the row."""
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", type=Path, default=Path("/tmp/discovery-bench"))
    p.add_argument("--keep", action="store_true", help="keep the checkpoint and the version")
    p.add_argument("--write-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--vocab-size", type=int, default=LLAMA3_8B["vocab_size"],
                   help="a smaller table for a quick run (default: Llama 3's 128256)")
    p.add_argument("--hidden-size", type=int, default=LLAMA3_8B["hidden_size"])
    args = p.parse_args(argv)
    LLAMA3_8B.update(vocab_size=args.vocab_size, hidden_size=args.hidden_size)
    if args.vocab_size <= 128004:  # smollm3's default pad id, and Llama 3's specials
        LLAMA3_8B.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    src, out = args.dir / "src", args.dir / "models" / "llama3-shaped" / "1"
    if args.write_only:
        print(write_checkpoint_shaped(src))
        return 0
    shutil.rmtree(args.dir, ignore_errors=True)
    write = _child([sys.executable, "-m", "training.bench.discovery", "--dir", str(args.dir),
                    "--write-only", "--vocab-size", str(args.vocab_size),
                    "--hidden-size", str(args.hidden_size)])
    if write[2] != 0:
        return 1
    table_bytes = 1
    for key in ("vocab_size", "hidden_size"):
        table_bytes *= int(LLAMA3_8B[key])
    table_bytes *= 2  # bf16
    floor = _child([sys.executable, "-c", _FLOOR,
                    str(src / "model-00001-of-00002.safetensors")])
    # Discovery alone (--name-map-check: find the rule, read the tables, write nothing),
    # then the whole import (discovery + writing the version, which hashes and saves it).
    alone = _child([sys.executable, "-m", "training.importers", "hf", str(src),
                    "--name-map-check"])
    run = _child([sys.executable, "-m", "training.importers", "hf", str(src), "--out",
                  str(out), "--no-tokenizer"])
    gib = 1 << 30
    row = {"checkpoint": f"Llama-3-8B-shaped, bf16, {LLAMA3_8B['vocab_size']} x "
                         f"{LLAMA3_8B['hidden_size']}, 2 shards",
           "write_s": round(write[0], 2),
           "table_GiB": round(table_bytes / gib, 3),
           "floor_s": round(floor[0], 2), "floor_peak_rss_GiB": round(floor[1] / gib, 3),
           "discovery_s": round(alone[0], 2),
           "discovery_peak_rss_GiB": round(alone[1] / gib, 3),
           "discovery_over_table_GiB": round((alone[1] - table_bytes) / gib, 3),
           "import_s": round(run[0], 2), "import_peak_rss_GiB": round(run[1] / gib, 3),
           "import_over_table_GiB": round((run[1] - table_bytes) / gib, 3),
           "exit": [alone[2], run[2]], "loadavg": Path("/proc/loadavg").read_text().split()[:3]}
    if run[2] == 0:
        manifest = json.loads((out / "manifest.json").read_text())
        row["rules"] = manifest.get("rules") or {}
        row["evidence"] = manifest["provenance"]["discovery"]["dtypes"]
    print(json.dumps(row, indent=2))
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)
    return 0 if run[2] == alone[2] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
