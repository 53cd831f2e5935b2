"""examples/hf_inputs_embeds.py: TOKEN_ONLY rows as HF inputs_embeds give input_ids' logits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from client import EmbeddingClient
from examples.hf_inputs_embeds import (
    HFInputs,
    build_hf_gpt2,
    fetch_inputs,
    import_hf_gpt2,
    logits_both_ways,
    main,
)
from tests.tiny_model import start

TEXT = "Input embeddings are what the first block reads."
IDS = [20560, 11525, 67, 654, 389, 644, 262, 717, 2512, 9743, 13]  # GPT-2 BPE of TEXT
C = 32  # build_hf_gpt2's default n_embd
N_POSITIONS = 64


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path, str]]:
    """(the HF model, its save_pretrained dir, target of a server over its imported tables)."""
    tmp = tmp_path_factory.mktemp("hf-inputs-embeds")
    model = build_hf_gpt2(tmp / "hf", seed=0)
    import_hf_gpt2(tmp / "hf", tmp / "models", "hf-gpt2")
    handle = start(tmp / "models", default_model="hf-gpt2")
    yield model, tmp / "hf", handle.target
    handle.stop()


@pytest.fixture(scope="module")
def client(served: tuple[Any, Path, str]) -> Iterator[EmbeddingClient]:
    with EmbeddingClient(served[2], timeout=30) as c:
        yield c


@pytest.mark.parametrize("start_position", [0, 7, N_POSITIONS - len(IDS)])
def test_inputs_are_token_rows_and_position_ids(served: tuple[Any, Path, str],
                                                client: EmbeddingClient,
                                                start_position: int) -> None:
    model = served[0]
    inputs = fetch_inputs(client, TEXT, start_position=start_position)
    assert inputs.input_ids.tolist() == [IDS]
    assert inputs.position_ids.tolist() == [list(range(start_position,
                                                       start_position + len(IDS)))]
    assert inputs.inputs_embeds.shape == (1, len(IDS), C)
    assert inputs.inputs_embeds.dtype == torch.float32
    rows = model.transformer.wte.weight.detach()[IDS]  # (T, C): token rows, no wpe
    assert inputs.inputs_embeds[0].numpy().tobytes() == rows.numpy().tobytes()


@pytest.mark.parametrize("start_position", [0, 7, N_POSITIONS - len(IDS)])
def test_logits_from_inputs_embeds_are_bit_identical(served: tuple[Any, Path, str],
                                                     client: EmbeddingClient,
                                                     start_position: int) -> None:
    inputs = fetch_inputs(client, TEXT, start_position=start_position)
    from_ids, from_embeds = logits_both_ways(served[0], inputs)
    assert from_ids.shape == (1, len(IDS), 50257)
    assert torch.equal(from_ids, from_embeds)


def test_the_rules_matter(served: tuple[Any, Path, str], client: EmbeddingClient) -> None:
    """Negative controls: each rule broken changes the logits, so the tests above can fail."""
    model = served[0]
    inputs = fetch_inputs(client, TEXT, start_position=7)
    from_ids, _ = logits_both_ways(model, inputs)
    # Offset sent to the service but not to HF: HF uses positions 0..T-1.
    no_offset = HFInputs(inputs.input_ids, inputs.inputs_embeds,
                         torch.arange(len(IDS)).unsqueeze(0))
    assert not torch.equal(logits_both_ways(model, no_offset)[1], from_ids)
    # The default compose already holds wpe: HF adds it a second time.
    summed = client.embed(TEXT, start_position=7).array.copy()
    twice = HFInputs(inputs.input_ids, torch.from_numpy(summed).unsqueeze(0),
                     inputs.position_ids)
    assert (logits_both_ways(model, twice)[1] - from_ids).abs().max() > 1e-3


def test_main_against_a_running_service(served: tuple[Any, Path, str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    _, hf_dir, target = served
    assert main(["--target", target, "--hf-dir", str(hf_dir), "--start-position", "3"]) == 0
    out = capsys.readouterr().out
    assert f"token_ids {IDS}  inputs_embeds (11, {C}) float32  position_ids 3..13" in out
    assert "logits from input_ids vs inputs_embeds: bit-identical (1, 11, 50257)" in out


def test_main_self_contained(capsys: pytest.CaptureFixture[str]) -> None:
    """No arguments: builds, imports and serves its own model."""
    assert main(["--text", "hello world", "--start-position", "5", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "token_ids [31373, 995]  inputs_embeds (2, 32) float32  position_ids 5..6" in out
    assert "bit-identical" in out


def test_target_needs_hf_dir() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--target", "127.0.0.1:1"])
    assert exc.value.code == 2
