"""examples/vllm_prompt_embeds.py: the EmbedsPrompt object, checked against the table rows."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import pytest
import torch

from client import EmbeddingClient
from examples.vllm_prompt_embeds import (
    TORCH_DTYPES,
    completions_body,
    embeds_prompt,
    main,
    to_torch,
)
from service.local import ServerHandle
from tests.tiny_model import DIM, tiny_tables

IDS = [31373, 995]  # "hello world"


@pytest.fixture(scope="module")
def client(server: ServerHandle) -> Iterator[EmbeddingClient]:
    with EmbeddingClient(server.target, timeout=30, raw_bfloat16=True) as c:
        yield c


def _bits(t: torch.Tensor) -> bytes:
    """The tensor's bytes, whatever its dtype (numpy has no bfloat16)."""
    return t.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_prompt_embeds_are_the_token_rows_in_the_model_dtype(client: EmbeddingClient,
                                                             dtype: str) -> None:
    prompt = embeds_prompt(client, "hello world", model="tiny", dtype=dtype)
    assert list(prompt) == ["prompt_embeds"]
    t = prompt["prompt_embeds"]
    assert t.dtype == TORCH_DTYPES[dtype]
    assert t.shape == (2, DIM)  # (sequence_length, hidden_size)
    token_table, position_table = tiny_tables(0)
    # What vLLM's own lookup gives in that dtype: the token rows, cast; no position rows.
    assert _bits(t) == _bits(token_table[IDS].to(TORCH_DTYPES[dtype]))
    assert _bits(t) != _bits((token_table[IDS] + position_table[:2]).to(TORCH_DTYPES[dtype]))


def test_rope_model_token_rows_whatever_the_compose(client: EmbeddingClient) -> None:
    """A RoPE model has no position table: token rows are all there is."""
    t = embeds_prompt(client, "hello world", model="rope")["prompt_embeds"]
    token_table, _ = tiny_tables(1)
    assert _bits(t) == _bits(token_table[IDS].to(torch.bfloat16))
    summed = to_torch(client.embed("hello world", model="rope", dtype="bfloat16"))
    assert _bits(summed) == _bits(t)


def test_completions_body_round_trips_through_vllms_loader(client: EmbeddingClient) -> None:
    prompt = embeds_prompt(client, "hello world", model="tiny")
    body = completions_body(prompt, model="gpt2", max_tokens=8)
    assert sorted(body) == ["max_tokens", "model", "prompt_embeds"]
    assert (body["model"], body["max_tokens"]) == ("gpt2", 8)
    # vLLM's Completions endpoint decodes it exactly like this.
    loaded = torch.load(io.BytesIO(base64.b64decode(body["prompt_embeds"])), weights_only=True)
    assert loaded.dtype == torch.bfloat16
    assert _bits(loaded) == _bits(prompt["prompt_embeds"])


def test_widened_bfloat16_is_refused(server: ServerHandle) -> None:
    with EmbeddingClient(server.target, timeout=30) as widening:
        e = widening.embed("hello world", model="tiny", dtype="bfloat16")
    with pytest.raises(ValueError, match="raw_bfloat16=True"):
        to_torch(e)


def test_main_against_a_running_service(server: ServerHandle,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--target", server.target, "--model", "tiny", "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    assert f"prompt_embeds (11, {DIM}) torch.float16 (T, hidden_size)" in out
    assert 'LLM(model=DIR, dtype="float16", enable_prompt_embeds=True)' in out


def test_main_self_contained(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--text", "hello world"]) == 0
    assert "prompt_embeds (2, 64) torch.bfloat16 (T, hidden_size)" in capsys.readouterr().out
