"""Every supported HF family, imported by the real importer and served by a real server,
equals transformers bit for bit: the default compose its ``hidden_states[0]`` (with
position offsets), COMPOSE_TOKEN_ONLY its ``get_input_embeddings()(ids)``; in fp32, and a
model stored in bf16 served in bf16 against the reference run in bf16."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from client import EmbeddingClient, EmbeddingError
from client.cli import main as cli_main
from service.local import ServerHandle
from tests.hf_models import (
    FAMILY_MODELS,
    HIDDEN,
    LEARNED,
    MAX_POS,
    VOCAB,
    one_thread,  # noqa: F401  (autouse: the reference on the server's one thread)
    reference,
    served_models,
    served_rows,
)

IDS = [5, 17, 0, 95, 42, 42, 7, 63, 1, 88, 30]  # T=11: pad id 0, the last row, a repeat
BF16 = ("gpt2", "opt-proj", "llama", "gemma", "bloom", "bert")  # one per rule


@pytest.fixture(scope="module")
def hf_server(tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[ServerHandle, dict[str, Any]]]:
    """One server over every family in fp32 (name) and some in bf16 (name-bf16)."""
    models = {key: (name, dtype) for name in FAMILY_MODELS
              for key, dtype in ((name, torch.float32), (f"{name}-bf16", torch.bfloat16))
              if dtype == torch.float32 or name in BF16}
    with served_models(tmp_path_factory.mktemp("hf"), models, "llama") as served:
        yield served


@pytest.mark.parametrize("name", list(FAMILY_MODELS))
def test_fp32_bit_for_bit(hf_server: tuple[ServerHandle, dict[str, Any]], name: str) -> None:
    handle, models = hf_server
    for start_position in (0, 7) if name in LEARNED else (0, 5):
        hidden, token = reference(models[name], name, IDS, start_position)
        got = served_rows(handle, name, IDS, start_position=start_position)
        assert got.shape == hidden.shape
        assert torch.equal(got, hidden), f"{name} hidden_states[0] at {start_position}"
        got_token = served_rows(handle, name, IDS, start_position=start_position, compose="token")
        assert torch.equal(got_token, token), f"{name} get_input_embeddings()"
    if name in LEARNED | {"bloom"}:
        # positions or a LayerNorm: the default compose is not the token rows here (for
        # Gemma it is: transformers 5 scales inside get_input_embeddings)
        assert not torch.equal(hidden[:, :token.shape[1]], token)


@pytest.mark.parametrize("name", BF16)
def test_bf16_stored_served_in_bf16(hf_server: tuple[ServerHandle, dict[str, Any]],
                                    name: str) -> None:
    """The same ops in the same dtype: even BLOOM's and BERT's LayerNorm, run by the
    server on (T, C) rows in bf16, round exactly as the reference's own LayerNorm does
    on (1, T, C) on this CPU (measured difference: 0 ulp)."""
    handle, models = hf_server
    model = models[f"{name}-bf16"]
    start_position = 3 if name in LEARNED else 0
    hidden, token = reference(model, name, IDS, start_position)
    assert hidden.dtype == torch.bfloat16
    got = served_rows(handle, f"{name}-bf16", IDS, start_position=start_position, dtype="bfloat16")
    assert torch.equal(got, hidden.float())
    got_token = served_rows(handle, f"{name}-bf16", IDS, compose="token", dtype="bfloat16")
    assert torch.equal(got_token, token.float())


def test_gemma_scale_rounds_in_the_model_dtype(hf_server: tuple[ServerHandle, dict[str, Any]]
                                                ) -> None:
    """sqrt(24) is 4.898979 in fp32 and 4.90625 in bf16: each model multiplies by its own."""
    handle, models = hf_server
    table = models["gemma-bf16"].get_input_embeddings().weight.detach()  # (V, C) bf16
    got = served_rows(handle, "gemma-bf16", [9], compose="token", dtype="bfloat16")
    want = table[9] * torch.tensor(HIDDEN ** 0.5).to(torch.bfloat16)  # (C,) bf16
    assert torch.equal(got[0], want.float())
    assert not torch.equal(got[0], (table[9].float() * HIDDEN ** 0.5).bfloat16().float())


def test_batch_equals_each_sequence(hf_server: tuple[ServerHandle, dict[str, Any]]) -> None:
    """EmbedBatch (several sequences, one job) gives each sequence's reference rows; for
    OPT's project_in each sequence gets its own matmul, as the reference runs it."""
    handle, models = hf_server
    seqs, starts = [IDS[:4], IDS, IDS[2:9]], [0, 2, 30]
    for name in ("opt-proj", "bert", "bloom", "gemma"):
        with EmbeddingClient(handle.target) as c:
            outs = c.embed_batch(seqs, start_positions=starts, model=name)
        for ids, s, e in zip(seqs, starts, outs):
            hidden, _ = reference(models[name], name, ids, s)
            assert torch.equal(torch.from_numpy(np.array(e.array)), hidden), name


def test_opt_project_in_widths_and_info(hf_server: tuple[ServerHandle, dict[str, Any]]) -> None:
    """Token-only rows have the table's width (8), the default compose the hidden size."""
    handle, _ = hf_server
    assert served_rows(handle, "opt-proj", IDS, compose="token").shape == (len(IDS), 8)
    assert served_rows(handle, "opt-proj", IDS).shape == (len(IDS), HIDDEN)
    with EmbeddingClient(handle.target) as c:
        info = c.model_info("opt-proj")
        gemma, bert = c.model_info("gemma"), c.model_info("bert")
    assert (info.family, info.rules, info.dim, info.hidden_size, info.position) == (
        "opt", "position_offset=2, project_in", 8, HIDDEN, "learned")
    assert (info.vocab_size, info.max_seq_len, info.has_tokenizer) == (VOCAB, MAX_POS, False)
    assert gemma.rules == f"embed_scale={HIDDEN ** 0.5:g}"
    assert bert.rules == "token_type, layernorm(eps=1e-12)"


def test_opt_position_only_skips_the_offset(hf_server: tuple[ServerHandle, dict[str, Any]]
                                            ) -> None:
    handle, models = hf_server
    table = models["opt"].get_decoder().embed_positions.weight.detach()  # (MAX_POS + 2, C)
    got = served_rows(handle, "opt", IDS, start_position=4, compose="position")
    assert torch.equal(got, table[4 + 2: 4 + 2 + len(IDS)])


def test_position_only_refused_without_a_table(hf_server: tuple[ServerHandle, dict[str, Any]]
                                               ) -> None:
    handle, _ = hf_server
    with pytest.raises(EmbeddingError) as info:
        served_rows(handle, "bloom", IDS, compose="position")
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "model 'bloom' has position 'none' (family 'bloom': its positions act inside " \
           "attention" in str(info.value)


def test_text_to_ids_only_model_refused(hf_server: tuple[ServerHandle, dict[str, Any]]) -> None:
    handle, _ = hf_server
    with EmbeddingClient(handle.target) as c, pytest.raises(EmbeddingError) as info:
        c.embed("hello", model="qwen2")
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "model 'qwen2' was imported without a tokenizer (ids-only)" in str(info.value)


def test_max_seq_len_from_config_or_flag(hf_server: tuple[ServerHandle, dict[str, Any]],
                                         tmp_path: Path) -> None:
    handle, _ = hf_server
    with EmbeddingClient(handle.target) as c:
        assert c.model_info("falcon").max_seq_len == MAX_POS  # max_position_embeddings
        assert c.model_info("bloom").max_seq_len == MAX_POS  # --max-seq-len
        with pytest.raises(EmbeddingError) as info:
            c.embed(ids=[1] * (MAX_POS - 2), model="llama", start_position=3)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_project_in_depends_on_threads(hf_server: tuple[ServerHandle, dict[str, Any]]) -> None:
    """Where the reference itself is ambiguous: OPT's project_in run on 2 threads rounds
    differently from 1 thread (this box: up to 2.4e-7 absolute). The service
    matches the reference run with its own thread count, bit for bit (above)."""
    handle, models = hf_server
    served = served_rows(handle, "opt-proj", IDS)
    torch.set_num_threads(2)
    two, _ = reference(models["opt-proj"], "opt-proj", IDS, 0)
    torch.set_num_threads(1)
    one, _ = reference(models["opt-proj"], "opt-proj", IDS, 0)
    assert torch.equal(served, one)
    assert torch.allclose(served, two, rtol=1e-6, atol=1e-6)  # measured: <= 2.4e-7


def test_bert_bf16_rounds_at_every_step(hf_server: tuple[ServerHandle, dict[str, Any]]) -> None:
    """Why rules run in the model's dtype: BERT in bf16 rounds (tok + type) and (+ pos)
    before its LayerNorm. Computing in fp32 and rounding once (the GPT-2 path's way) would
    differ from that reference; measured on 40 tokens here: 263 of 960 elements, up to 205
    bf16 ulps (near zero). BLOOM's LayerNorm alone: 0 (torch's bf16 LayerNorm is fp32 inside)."""
    handle, models = hf_server
    ids = list(range(0, VOCAB, 3))[:MAX_POS]
    served = served_rows(handle, "bert-bf16", ids, dtype="bfloat16")
    hidden, _ = reference(models["bert-bf16"], "bert", ids, 0)
    once, _ = reference(models["bert-bf16"].float(), "bert", ids, 0)
    models["bert-bf16"].to(torch.bfloat16)  # .float() converted it in place
    assert torch.equal(served, hidden.float())
    assert not torch.equal(served, once.bfloat16().float())


def test_embedctl_info_shows_family_rules_tokenizer(
        hf_server: tuple[ServerHandle, dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    handle, _ = hf_server
    assert cli_main(["--target", handle.target, "info", "--model", "opt-proj"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "tokenizer none (ids-only: text requests are refused)" in lines
    assert f"family opt  rules position_offset=2, project_in  hidden_size {HIDDEN}" in lines
