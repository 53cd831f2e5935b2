"""The discovery benchmark row runs end to end at a small size (its figures are not
asserted: a benchmark, not a timed test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.bench.discovery import main


def test_row_at_a_small_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dir", str(tmp_path / "b"), "--vocab-size", "512", "--hidden-size", "64",
                 "--keep"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["checkpoint"] == "Llama-3-8B-shaped, bf16, 512 x 64, 2 shards"
    assert row["table_GiB"] == round(512 * 64 * 2 / (1 << 30), 3)
    assert row["exit"] == [0, 0]
    assert row["rules"] == {}
    assert row["evidence"] == ["float32", "bfloat16"]
    assert row["discovery_peak_rss_GiB"] > 0
    manifest = json.loads((tmp_path / "b" / "models" / "llama3-shaped" / "1" /
                           "manifest.json").read_text())
    assert (manifest["family"], manifest["dim"], manifest["vocab_size"]) == ("smollm3", 64, 512)
    assert manifest["provenance"]["tensor_names"] == {
        "token_embedding": "model.embed_tokens.weight"}
    assert set(manifest["provenance"]["source_files"]) == {
        "config.json", "model-00001-of-00002.safetensors"}  # the layer's shard never read
