"""An object shrunk, truncated or unlinked by its owner while registered never takes the
server down: that request gets FAILED_PRECONDITION naming the region, and the server keeps
serving everyone (batch-mates of the failed request included)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import grpc
import pytest

from bench.soak.shm_truncate import MAX_SEQ_LEN, MODEL, VOCAB, run_truncate_scenario, tables
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.inference.v2 import grpc_service_pb2 as oip
from service.format.tokenizer import default_ranks_path, gpt2_spec
from service.format.writer import write_checkpoint
from service.local import ServerHandle
from tests.security.shm_helpers import (
    IDS,
    ROW_BYTES,
    As,
    MakeObject,
    expected_rows,
    infer_shm,
)
from tests.tiny_model import DIM, start


@pytest.mark.parametrize("how", ["shrink", "truncate", "unlink"])
def test_object_changed_by_its_owner_fails_that_request_only(
        server: ServerHandle, objects: MakeObject, how: str) -> None:
    obj, good = objects(4096), objects(4096)
    with As.at(server.target) as client:
        client.register(f"victim-{how}", obj)
        client.register(f"good-{how}", good)
        client.embed_into(f"victim-{how}")  # the region works
        if how == "shrink":
            os.truncate(obj.path, 16)  # shorter than the rows
        elif how == "truncate":
            os.truncate(obj.path, 0)
        else:
            obj.path.unlink()
        code, message = client.status("native", "Embed", _embed(f"victim-{how}"))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert f"region 'victim-{how}'" in message
        assert ("unlinked" if how == "unlink" else f"shrunk below the {ROW_BYTES}") in message
        # OIP names the same region: the same answer.
        code, _ = client.status("oip", "ModelInfer", infer_shm(f"victim-{how}", None))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        # The server keeps serving: through the response and through another region.
        assert client.embed() == expected_rows(IDS)
        client.embed_into(f"good-{how}", offset=64)
        assert good.read(64, ROW_BYTES) == expected_rows(IDS)
        if how != "unlink":
            assert obj.path.stat().st_size == (16 if how == "shrink" else 0)  # not grown
        client("native", "UnregisterSharedMemory", _unregister(""))


def test_shrink_while_queued_fails_only_that_job_of_the_batch(
        tiny_repo: Path, objects: MakeObject) -> None:
    """Two requests wait in one batch; the owner of one region shrinks it meanwhile: that
    request fails, its batch-mate gets exact rows."""
    victim, mate = objects(4096), objects(4096)
    with start(tiny_repo, max_batch_delay_us=600_000) as handle, \
            As.at(handle.target) as client:
        client.register("victim", victim)
        client.register("mate", mate)
        outcomes: dict[str, object] = {}

        def send(region: str) -> None:
            try:
                outcomes[region] = client.embed_into(region)
            except grpc.RpcError as e:
                outcomes[region] = e.code()

        threads = [threading.Thread(target=send, args=(r,)) for r in ("victim", "mate")]
        for t in threads:
            t.start()
        threading.Event().wait(0.1)  # both are queued, waiting for the batch delay
        os.truncate(victim.path, 8)
        for t in threads:
            t.join(30)
        assert outcomes["victim"] == grpc.StatusCode.FAILED_PRECONDITION
        assert not isinstance(outcomes["mate"], grpc.StatusCode)
        assert mate.read(0, ROW_BYTES) == expected_rows(IDS)
        assert client.embed() == expected_rows(IDS)


def test_rows_land_only_inside_the_object(server: ServerHandle,
                                          objects: MakeObject) -> None:
    """Nothing is written before the region's offset or after its rows."""
    obj = objects(8192)
    with As.at(server.target) as client:
        client.register("inside", obj, offset=1000, byte_size=4000)
        client.embed_into("inside", offset=24)
        data = obj.read()
        assert data[:1024] == b"\0" * 1024
        assert data[1024: 1024 + ROW_BYTES] == expected_rows(IDS)
        assert data[1024 + ROW_BYTES:] == b"\0" * (8192 - 1024 - ROW_BYTES)
        client("native", "UnregisterSharedMemory", _unregister("inside"))


def _embed(region: str) -> pb.EmbedRequest:
    return pb.EmbedRequest(token_ids=pb.TokenIds(ids=IDS),
                           output=pb.SharedMemoryOutput(region=region))


def _unregister(name: str) -> pb.UnregisterSharedMemoryRequest:
    return pb.UnregisterSharedMemoryRequest(name=name)


def test_truncated_under_load_loses_nothing_for_others(tmp_path: Path) -> None:
    """The soak's scenario (bench/soak/shm_truncate), 2 s in process: a careless client's
    objects truncated under load; 0 lost, 0 corrupted good answers; server up."""
    token_table, position_table = tables(3)
    write_checkpoint(tmp_path / MODEL / "1", token_table=token_table,
                     position_table=position_table, position="learned",
                     max_seq_len=MAX_SEQ_LEN, vocab_size=VOCAB, tokenizer_spec=gpt2_spec(),
                     tokenizer_ranks=default_ranks_path())
    with start(tmp_path, default_model=MODEL) as handle:
        out = asyncio.run(run_truncate_scenario(handle.target, 2.0, 2, seed=0, table_seed=3))
    assert out.passed, out
    assert out.good_ok > 10
    assert out.truncations > 2


def test_reused_row_buffers_never_leak_an_earlier_request(
        server: ServerHandle, objects: MakeObject) -> None:
    """Row buffers are reused between requests: a padded [B, T, C] answer after a larger
    one still has zero padding, not the earlier request's rows."""
    obj = objects(8192)
    with As.at(server.target) as client:
        client.register("reuse", obj)
        for _ in range(3):  # fill (and hand back) buffers with non-zero rows
            client.embed_into("reuse", ids=list(range(1, 61)))
        request = oip.ModelInferRequest(model_name="tiny", inputs=[
            oip.ModelInferRequest.InferInputTensor(name="text", datatype="BYTES", shape=[2])])
        request.inputs[0].contents.bytes_contents.extend([b"hello world", b"a"])
        out = request.outputs.add(name="embeddings")
        out.parameters["shared_memory_region"].string_param = "reuse"
        out.parameters["shared_memory_offset"].int64_param = 4096
        client("oip", "ModelInfer", request)  # lengths 2 and 1: one padding row
        row = DIM * 4
        data = obj.read(4096, 4 * row)  # [2, 2, C]
        assert data[:2 * row] == expected_rows([31373, 995])
        assert data[2 * row: 3 * row] == expected_rows([64])
        assert data[3 * row:] == b"\0" * row
        client("native", "UnregisterSharedMemory", _unregister("reuse"))
