"""Big bf16 tables: kept as the checkpoint's memory map and gathered straight into a bf16
response (never widened as a whole), and the bench that measures them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from service.engine.loading import load_model
from service.engine.tables import COMPOSE_TOKEN_PLUS_POSITION
from service.format.checkpoint import read_checkpoint
from service.format.rules import Rules
from service.format.writer import write_checkpoint


def _bf16_model(tmp_path: Path) -> Path:
    g = torch.Generator().manual_seed(0)
    out = tmp_path / "m" / "1"
    write_checkpoint(out, token_table=torch.randn(1000, 64, generator=g).bfloat16(),
                     position="none", max_seq_len=4096, vocab_size=1000, tokenizer_spec=None,
                     tokenizer_ranks=None, family="llama", rules=Rules())
    return out


def test_bf16_table_stays_a_memory_map(tmp_path: Path) -> None:
    out = _bf16_model(tmp_path)
    model = load_model("m", out, torch.device("cpu"), None)  # --table-dtype stored
    mapped = read_checkpoint(out).token_table
    table = model.tables.token_table
    assert table.dtype == torch.bfloat16
    # the tables hold the checkpoint's own tensor (a view of the map), not a copy
    assert model.checkpoint.token_table.data_ptr() == table.data_ptr()
    assert torch.equal(mapped, table)


def test_bf16_rows_gathered_straight_into_the_output(tmp_path: Path) -> None:
    model = load_model("m", _bf16_model(tmp_path), torch.device("cpu"), None)
    tables = model.tables
    ids = np.array([5, 999, 0, 5, 123], dtype=np.int64)
    out = torch.full((5, 64), float("nan"), dtype=torch.bfloat16)
    tables.embed_into([(ids, [(7, 5)], out)], COMPOSE_TOKEN_PLUS_POSITION)
    assert torch.equal(out.view(torch.int16), tables.token_table[ids].view(torch.int16))
    assert tables._scratch == {}  # no fp32 scratch: nothing was widened
    wide = torch.empty(5, 64)
    tables.embed_into([(ids, [(0, 5)], wide)], COMPOSE_TOKEN_PLUS_POSITION)
    assert torch.equal(wide, tables.token_table[ids].float())  # fp32 out: rows widened

