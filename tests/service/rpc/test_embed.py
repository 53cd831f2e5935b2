"""Embedding RPCs against oracles: HF GPT-2 for the sum, the tables for everything else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
import transformers  # in requirements-dev.txt: missing is an error, never a skip

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from tests.tiny_model import TRAINED_ROWS, MakeCheckpoint, start, tiny_tables


def rows(t: pb.Tensor) -> torch.Tensor:
    """Decode a response tensor exactly (bf16 from its raw bits)."""
    if t.dtype == pb.DTYPE_BFLOAT16:
        bits = np.frombuffer(t.data, dtype="<i2").copy()
        return torch.from_numpy(bits).view(torch.bfloat16).reshape(tuple(t.shape))
    np_dtype = {pb.DTYPE_FLOAT32: "<f4", pb.DTYPE_FLOAT16: "<f2"}[t.dtype]
    return torch.from_numpy(np.frombuffer(t.data, dtype=np_dtype).copy()).reshape(tuple(t.shape))


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, ServerHandle]]:
    """A random HF GPT-2, saved with save_pretrained, imported, and served."""
    from training.importers import main as import_main

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50257, n_positions=32, n_embd=24, n_layer=1,
                                     n_head=2)
    model = transformers.GPT2LMHeadModel(config).eval()
    src = tmp_path_factory.mktemp("hf")
    model.save_pretrained(src, safe_serialization=True)
    repo = tmp_path_factory.mktemp("hf_models")
    assert import_main(["hf-gpt2", str(src), "--out", str(repo / "gpt2" / "1")]) == 0
    handle = start(repo, default_model="gpt2")
    yield model, handle
    handle.stop()


def test_hello_world_exact_rows(stub: pb_grpc.EmbeddingServiceStub) -> None:
    token_table, position_table = tiny_tables(0)
    r = stub.Embed(pb.EmbedRequest(text="hello world", request_id="req-1"))
    assert list(r.token_ids) == [31373, 995]
    assert list(r.embeddings.shape) == [2, 16]
    assert r.embeddings.dtype == pb.DTYPE_FLOAT32
    assert len(r.embeddings.data) == 2 * 16 * 4
    expected = token_table[[31373, 995]] + position_table[[0, 1]]  # (T, C)
    assert torch.equal(rows(r.embeddings), expected)
    assert (r.model, r.version, r.request_id, r.start_position) == ("tiny", 1, "req-1", 0)
    assert len(r.checkpoint_id) == 64
    assert list(r.untrained_token_indices) == [0]  # 31373 >= TRAINED_ROWS > 995
    assert r.timing.total_ns >= r.timing.compute_ns > 0


def test_untrained_indices_mark_only_untrained_rows(stub: pb_grpc.EmbeddingServiceStub) -> None:
    ids = [5, TRAINED_ROWS + 3, 999, 40000]
    r = stub.Embed(pb.EmbedRequest(token_ids=pb.TokenIds(ids=ids)))
    assert list(r.untrained_token_indices) == [1, 3]


@pytest.mark.parametrize("start_position", [0, 7])
def test_float32_equals_hf_hidden_states(hf_gpt2: tuple[object, ServerHandle],
                                         start_position: int) -> None:
    model, handle = hf_gpt2
    ids = [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13]
    with grpc.insecure_channel(handle.target) as channel:
        r = pb_grpc.EmbeddingServiceStub(channel).Embed(pb.EmbedRequest(
            token_ids=pb.TokenIds(ids=ids), start_position=start_position))
    position_ids = torch.arange(start_position, start_position + len(ids)).unsqueeze(0)
    with torch.no_grad():
        out = model.transformer(torch.tensor([ids]), position_ids=position_ids,  # type: ignore[attr-defined]
                                output_hidden_states=True)
    assert torch.equal(rows(r.embeddings), out.hidden_states[0][0])  # bit for bit


def test_token_only_as_inputs_embeds_gives_same_logits(
        hf_gpt2: tuple[object, ServerHandle]) -> None:
    model, handle = hf_gpt2
    text = "Input embeddings are what the first block reads."
    with grpc.insecure_channel(handle.target) as channel:
        r = pb_grpc.EmbeddingServiceStub(channel).Embed(pb.EmbedRequest(
            text=text, compose=pb.COMPOSE_TOKEN_ONLY))
    ids = torch.tensor([list(r.token_ids)])
    with torch.no_grad():
        from_ids = model(input_ids=ids).logits  # type: ignore[operator]
        from_embeds = model(inputs_embeds=rows(r.embeddings).unsqueeze(0)).logits  # type: ignore[operator]
    assert torch.equal(from_ids, from_embeds)


@pytest.mark.parametrize(("dtype", "torch_dtype"), [(pb.DTYPE_FLOAT16, torch.float16),
                                                    (pb.DTYPE_BFLOAT16, torch.bfloat16)])
def test_half_dtypes_are_the_float32_result_cast(stub: pb_grpc.EmbeddingServiceStub, dtype: int,
                                                 torch_dtype: torch.dtype) -> None:
    req = pb.EmbedRequest(text="The quick brown fox", start_position=3)
    full = rows(stub.Embed(req).embeddings)
    req.dtype = dtype  # type: ignore[assignment]
    half = stub.Embed(req).embeddings
    assert half.dtype == dtype
    assert len(half.data) == full.numel() * 2
    assert torch.equal(rows(half), full.to(torch_dtype))


def test_compose_modes(stub: pb_grpc.EmbeddingServiceStub) -> None:
    token_table, position_table = tiny_tables(0)
    ids = [10, 20, 30]
    get = lambda compose: rows(stub.Embed(pb.EmbedRequest(  # noqa: E731
        token_ids=pb.TokenIds(ids=ids), start_position=5, compose=compose)).embeddings)
    assert torch.equal(get(pb.COMPOSE_TOKEN_ONLY), token_table[ids])
    assert torch.equal(get(pb.COMPOSE_POSITION_ONLY), position_table[5:8])
    assert torch.equal(get(pb.COMPOSE_TOKEN_PLUS_POSITION), token_table[ids] + position_table[5:8])


def test_rope_model_returns_token_rows(stub: pb_grpc.EmbeddingServiceStub) -> None:
    token_table, _ = tiny_tables(1)
    r = stub.Embed(pb.EmbedRequest(model="rope", token_ids=pb.TokenIds(ids=[1, 2]),
                                   start_position=9))
    assert torch.equal(rows(r.embeddings), token_table[[1, 2]])


@pytest.mark.parametrize(("truncate", "kept", "start"), [
    (pb.TRUNCATE_RIGHT, list(range(100, 104)), 60),
    (pb.TRUNCATE_LEFT, list(range(106, 110)), 60),
])
def test_truncation(stub: pb_grpc.EmbeddingServiceStub, truncate: int, kept: list[int],
                    start: int) -> None:
    token_table, position_table = tiny_tables(0)
    r = stub.Embed(pb.EmbedRequest(token_ids=pb.TokenIds(ids=list(range(100, 110))),
                                   start_position=start, truncate=truncate))
    assert list(r.token_ids) == kept
    assert r.truncated_tokens == 6
    assert r.start_position == start
    assert torch.equal(rows(r.embeddings), token_table[kept] + position_table[60:64])


@pytest.mark.parametrize(("truncate", "kept"), [(pb.TRUNCATE_RIGHT, list(range(100, 104))),
                                                 (pb.TRUNCATE_LEFT, list(range(106, 110)))])
def test_batch_items_echo_the_ids_kept(stub: pb_grpc.EmbeddingServiceStub, truncate: int,
                                       kept: list[int]) -> None:
    """Each item echoes its ids as kept: whole, truncated, or tokenized from text."""
    token_table, position_table = tiny_tables(0)
    batch = stub.EmbedBatch(pb.EmbedBatchRequest(truncate=truncate, inputs=[
        pb.EmbedInput(token_ids=pb.TokenIds(ids=[5, 6])),
        pb.EmbedInput(token_ids=pb.TokenIds(ids=list(range(100, 110))), start_position=60),
        pb.EmbedInput(text="hello world")]))
    assert [list(item.token_ids) for item in batch.items] == [[5, 6], kept, [31373, 995]]
    assert [item.truncated_tokens for item in batch.items] == [0, 6, 0]
    assert list(batch.offsets) == [0, 2, 6, 8]
    assert torch.equal(rows(batch.embeddings)[2:6], token_table[kept] + position_table[60:64])


def test_allow_special_tokens(stub: pb_grpc.EmbeddingServiceStub) -> None:
    plain = stub.Embed(pb.EmbedRequest(text="<|endoftext|>"))
    special = stub.Embed(pb.EmbedRequest(text="<|endoftext|>", allow_special_tokens=True))
    assert list(plain.token_ids) == [27, 91, 437, 1659, 5239, 91, 29]
    assert list(special.token_ids) == [50256]


@pytest.mark.parametrize("dtype", [pb.DTYPE_FLOAT32, pb.DTYPE_FLOAT16, pb.DTYPE_BFLOAT16])
@pytest.mark.parametrize("compose", [pb.COMPOSE_TOKEN_PLUS_POSITION, pb.COMPOSE_TOKEN_ONLY,
                                     pb.COMPOSE_POSITION_ONLY])
def test_batch_equals_single_bit_for_bit(stub: pb_grpc.EmbeddingServiceStub, dtype: int,
                                         compose: int) -> None:
    inputs = [pb.EmbedInput(text="hello world"),
              pb.EmbedInput(token_ids=pb.TokenIds(ids=[7, 8, 9, 10]), start_position=11),
              pb.EmbedInput(text="batched == single", start_position=2)]
    batch = stub.EmbedBatch(pb.EmbedBatchRequest(inputs=inputs, dtype=dtype, compose=compose,
                                                 request_id="b"))
    packed = rows(batch.embeddings)
    assert batch.request_id == "b"
    assert len(batch.offsets) == 4
    assert batch.offsets[0] == 0
    for i, inp in enumerate(inputs):
        single = stub.Embed(pb.EmbedRequest(dtype=dtype, compose=compose,
                                            start_position=inp.start_position,
                                            **{inp.WhichOneof("input"): getattr(  # type: ignore[arg-type]
                                                inp, inp.WhichOneof("input"))}))
        lo, hi = batch.offsets[i], batch.offsets[i + 1]
        assert list(batch.items[i].token_ids) == list(single.token_ids)
        assert torch.equal(packed[lo:hi].view(torch.int16) if dtype == pb.DTYPE_BFLOAT16
                           else packed[lo:hi],
                           rows(single.embeddings).view(torch.int16)
                           if dtype == pb.DTYPE_BFLOAT16 else rows(single.embeddings))


def test_concurrent_requests_batch_bit_identical(server: ServerHandle) -> None:
    """Many requests in flight at once land in shared batches; each equals its single run."""
    token_table, position_table = tiny_tables(0)
    with grpc.insecure_channel(server.target) as channel:
        embed = pb_grpc.EmbeddingServiceStub(channel).Embed
        futures = [embed.future(pb.EmbedRequest(token_ids=pb.TokenIds(ids=[i, i + 1, i + 2]),
                                                start_position=i % 50)) for i in range(64)]
        for i, f in enumerate(futures):
            expected = token_table[[i, i + 1, i + 2]] + position_table[i % 50: i % 50 + 3]
            assert torch.equal(rows(f.result().embeddings), expected)


def test_stream_preserves_request_order(stub: pb_grpc.EmbeddingServiceStub) -> None:
    token_table, position_table = tiny_tables(0)
    requests = [pb.EmbedRequest(token_ids=pb.TokenIds(ids=[i] * (1 + i % 5)),
                                request_id=f"r{i}") for i in range(40)]
    responses = list(stub.EmbedStream(iter(requests)))
    assert [r.request_id for r in responses] == [f"r{i}" for i in range(40)]
    for i, r in enumerate(responses):
        T = 1 + i % 5
        assert torch.equal(rows(r.embeddings), token_table[[i] * T] + position_table[:T])


def test_a_bad_stream_request_ends_the_stream_after_the_answers_before_it(
        tiny_repo: Path) -> None:
    # A 50 ms batch delay keeps the good requests queued while the bad one fails at once in
    # validation: its status must still wait for their answers.
    server = start(tiny_repo, max_batch_delay_us=50_000)
    good = [pb.EmbedRequest(token_ids=pb.TokenIds(ids=[i, i + 1]), request_id=f"r{i}")
            for i in range(3)]
    bad = pb.EmbedRequest(token_ids=pb.TokenIds(ids=[7, 50257]), request_id="bad")
    after = pb.EmbedRequest(token_ids=pb.TokenIds(ids=[1]), request_id="after")
    answered: list[str] = []
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.EmbeddingServiceStub(channel)

            def read_all() -> None:
                for response in stub.EmbedStream(iter([*good, bad, after])):
                    answered.append(response.request_id)

            with pytest.raises(grpc.RpcError) as info:
                read_all()
            assert answered == ["r0", "r1", "r2"]
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details() == ("input.token_ids.ids[1]=50257 is out of range "
                                            "[0, 50257) for model 'tiny'")
            assert stub.Embed(after).request_id == "after"  # the server keeps serving
    finally:
        server.stop()


def test_tokenize_detokenize_and_model_rpcs(stub: pb_grpc.EmbeddingServiceStub) -> None:
    t = stub.Tokenize(pb.TokenizeRequest(text="hello world"))
    assert list(t.token_ids) == [31373, 995]
    assert list(t.tokens) == [b"hello", b" world"]
    assert stub.Detokenize(pb.DetokenizeRequest(token_ids=[31373, 995])).text == "hello world"
    models = stub.ListModels(pb.ListModelsRequest()).models
    assert [(m.model, m.version, m.position) for m in models] == [("rope", 1, "none"),
                                                                   ("tiny", 1, "learned")]
    info = stub.GetModelInfo(pb.GetModelInfoRequest(model="tiny"))
    assert (info.vocab_size, info.table_rows, info.dim, info.max_seq_len) == (50257, 50304, 16, 64)
    assert info.is_default
    assert info.has_row_updates
    assert info.untrained_rows == 50257 - TRAINED_ROWS
    assert info.tokenizer.special_tokens["<|endoftext|>"] == 50256


def test_bfloat16_tables_add_in_fp32(tiny_repo: Path) -> None:
    """--table-dtype bfloat16 halves table memory; rows are widened, then added in fp32."""
    token_table, position_table = tiny_tables(0)
    handle = start(tiny_repo, table_dtype="bfloat16")
    try:
        with grpc.insecure_channel(handle.target) as channel:
            r = pb_grpc.EmbeddingServiceStub(channel).Embed(pb.EmbedRequest(
                token_ids=pb.TokenIds(ids=[3, 4]), start_position=2))
    finally:
        handle.stop()
    expected = (token_table[[3, 4]].to(torch.bfloat16).float()
                + position_table[2:4].to(torch.bfloat16).float())  # (T, C)
    assert torch.equal(rows(r.embeddings), expected)


def test_sinusoidal_positions_computed_at_load(tmp_path: Path,
                                               make_checkpoint: MakeCheckpoint) -> None:
    from service.format.positions import sinusoidal_table

    make_checkpoint(tmp_path, "sin", position="sinusoidal", seed=2)
    token_table, _ = tiny_tables(2)
    handle = start(tmp_path, default_model="sin")
    try:
        with grpc.insecure_channel(handle.target) as channel:
            stub = pb_grpc.EmbeddingServiceStub(channel)
            both = stub.Embed(pb.EmbedRequest(token_ids=pb.TokenIds(ids=[9, 8]),
                                              start_position=5))
            only = stub.Embed(pb.EmbedRequest(token_ids=pb.TokenIds(ids=[9, 8]),
                                              start_position=5,
                                              compose=pb.COMPOSE_POSITION_ONLY))
    finally:
        handle.stop()
    table = sinusoidal_table(64, 16)  # (max_seq_len, C)
    assert torch.equal(rows(only.embeddings), table[5:7])
    assert torch.equal(rows(both.embeddings), token_table[[9, 8]] + table[5:7])
    assert float(table[0, 1]) == 1.0
    assert float(table[0, 0]) == 0.0
