"""CUDA shared memory on a GPU: device memory of this process (``cudaMalloc``, exported with
``cudaIpcGetMemHandle``) registered with a server whose tables are on the GPU (a child
process: a handle cannot be opened by the process that made it), filled by the server's
device, read here as a torch tensor over the same memory.

Bit for bit: every dtype x compose of the tiny models equals the same server's host output
and a CPU server's; every family rule (``cuda_families``) equals the same server's host
output, and a CPU server's too where the rules are elementwise (a gather, an add, a scale:
IEEE operations round the same on both). A LayerNorm and OPT's project_in GEMM reduce in
another order on the device than on a CPU, so for those the reference is the GPU's host
path.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from client import EmbeddingClient, EmbeddingError
from client.cuda_shm import CudaSharedMemoryRegion
from client.dlpack import DeviceRows
from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.inference.v2 import grpc_service_pb2 as oip
from service.engine.cuda_shm import parse_handle
from service.local import ServerHandle
from tests.security.shm_helpers import As, channel
from tests.service.engine.cuda_families import FAMILIES, FAMILY_IDS, REDUCING, family_repo
from tests.service.engine.cuda_server import ChildServer, child_server
from tests.tiny_model import DIM, start

pytestmark = pytest.mark.gpu

IDS = [31373, 995, 0, 50256, 7, 11]
DTYPES = ("float32", "float16", "bfloat16")
COMPOSES = ("token+position", "token", "position")


def as_bytes(rows: DeviceRows | torch.Tensor) -> bytes:
    """The rows' bytes, copied to the host here (the test's copy, not the service's)."""
    t = torch.from_dlpack(rows) if isinstance(rows, DeviceRows) else rows
    return t.cpu().contiguous().view(torch.uint8).numpy().tobytes()


@pytest.fixture(scope="module")
def gpu(tiny_repo: Path) -> Iterator[ChildServer]:
    with child_server(tiny_repo) as served:
        yield served


@pytest.fixture(scope="module")
def cpu(tiny_repo: Path) -> Iterator[ServerHandle]:
    handle = start(tiny_repo, device="cpu")
    yield handle
    handle.stop()


def embed(c: EmbeddingClient, **kw: Any) -> Any:
    return c.embed(**kw)


def test_rows_in_the_region_equal_the_host_path(gpu: ChildServer, cpu: ServerHandle) -> None:
    with EmbeddingClient(gpu.target, raw_bfloat16=True) as c, \
            EmbeddingClient(cpu.target, raw_bfloat16=True) as ref, \
            CudaSharedMemoryRegion("rows", 1 << 20) as region:
        assert parse_handle(region.raw_handle, 0, region.byte_size, "rows") == \
            region.raw_handle  # a real handle passes the server's parsing
        c.register_cuda_shared_memory(region)
        (listed,) = c.list_cuda_shared_memory()
        assert listed == pb.CudaSharedMemoryRegion(name="rows", device_id=0,
                                                   byte_size=1 << 20)
        for model in ("tiny", "rope"):
            for dtype in DTYPES:
                for compose in COMPOSES:
                    if model == "rope" and compose == "position":
                        continue  # FAILED_PRECONDITION, as on the host path
                    kw = {"ids": IDS, "model": model, "dtype": dtype, "compose": compose,
                          "start_position": 5}
                    host = embed(c, **kw).array.tobytes()
                    e = embed(c, **kw, cuda_region=region, cuda_offset=512)
                    t = torch.from_dlpack(e.rows)
                    assert (t.device, t.data_ptr()) == (torch.device("cuda", 0),
                                                        region.address + 512)
                    assert (e.region, e.offset, e.byte_size, e.wire_dtype, e.token_ids) == (
                        "rows", 512, len(host), dtype, IDS)
                    assert as_bytes(t) == host, (model, dtype, compose)
                    assert host == embed(ref, **kw).array.tobytes(), (model, dtype, compose)
        c.unregister_cuda_shared_memory("rows")
        assert c.list_cuda_shared_memory() == []


def test_batch_stream_and_padded_infer(gpu: ChildServer) -> None:
    texts = ["hello world", "Input embeddings are what the first block reads."]
    with channel(gpu.target) as ch, CudaSharedMemoryRegion("many", 1 << 20) as region:
        me = As(ch)
        me("native", "RegisterCudaSharedMemory",
           pb.RegisterCudaSharedMemoryRequest(region=region.region_message()))
        inputs = [pb.EmbedInput(token_ids=pb.TokenIds(ids=IDS[:2])),
                  pb.EmbedInput(text=texts[1], start_position=3)]
        packed = me("native", "EmbedBatch", pb.EmbedBatchRequest(inputs=inputs)).embeddings
        batch = me("native", "EmbedBatch", pb.EmbedBatchRequest(
            inputs=inputs, output=pb.SharedMemoryOutput(region="many", offset=4096,
                                                        cuda=True)))
        assert as_bytes(region.rows("float32", list(packed.shape), 4096)) == packed.data
        assert batch.output == pb.SharedMemoryRange(region="many", offset=4096,
                                                    byte_size=len(packed.data), cuda=True)
        stream = list(me.native.EmbedStream(iter([
            pb.EmbedRequest(token_ids=pb.TokenIds(ids=ids), dtype=pb.DTYPE_FLOAT16,
                            output=pb.SharedMemoryOutput(region="many", offset=at, cuda=True))
            for ids, at in ((IDS[:3], 65536), (IDS[3:], 131072))]), timeout=30))
        for r, ids in zip(stream, (IDS[:3], IDS[3:])):
            want = me("native", "Embed", pb.EmbedRequest(token_ids=pb.TokenIds(ids=ids),
                                                         dtype=pb.DTYPE_FLOAT16)).embeddings
            assert as_bytes(region.rows("float16", [len(ids), DIM], r.output.offset)) == \
                want.data
        # OIP: two texts of different lengths, padded [B, T, C] with zero rows
        infer = oip.ModelInferRequest(model_name="tiny", inputs=[
            oip.ModelInferRequest.InferInputTensor(name="text", datatype="BYTES", shape=[2])])
        infer.inputs[0].contents.bytes_contents.extend(t.encode() for t in texts)
        wire = me("oip", "ModelInfer", infer)
        out = infer.outputs.add(name="embeddings")
        out.parameters["shared_memory_region"].string_param = "many"
        out.parameters["shared_memory_offset"].int64_param = 262144
        placed = me("oip", "ModelInfer", infer)
        shape = list(placed.outputs[0].shape)
        assert shape == list(wire.outputs[0].shape)
        assert shape[1] > 2  # the texts' lengths differ: the first is padded
        assert as_bytes(region.rows("float32", shape, 262144)) == wire.raw_output_contents[0]
        me("native", "UnregisterCudaSharedMemory", pb.UnregisterCudaSharedMemoryRequest())


def test_every_family_dtype_and_compose(tmp_path_factory: pytest.TempPathFactory) -> None:
    repo = family_repo(tmp_path_factory.mktemp("cuda-families"))
    compared: dict[str, int] = {}
    refusals: list[tuple[str, str, grpc.StatusCode]] = []
    with child_server(repo, default_model="plain") as served, \
            start(repo, device="cpu", default_model="plain") as cpu_server, \
            EmbeddingClient(served.target, raw_bfloat16=True) as c, \
            EmbeddingClient(cpu_server.target, raw_bfloat16=True) as ref, \
            CudaSharedMemoryRegion("fam", 1 << 20) as region:
        c.register_cuda_shared_memory(region)
        for name in FAMILIES:
            for dtype in DTYPES:
                for compose in COMPOSES:
                    kw = {"ids": FAMILY_IDS, "model": name, "dtype": dtype,
                          "compose": compose, "start_position": 3}
                    try:
                        host = embed(c, **kw).array.tobytes()
                    except EmbeddingError as refused:  # position-only without a table
                        refusals.append((name, compose, refused.code))
                        continue
                    e = embed(c, **kw, cuda_region=region, cuda_offset=256)
                    assert as_bytes(e.rows) == host, (name, dtype, compose)
                    if name not in REDUCING:
                        assert host == embed(ref, **kw).array.tobytes(), (name, dtype, compose)
                    compared[name] = compared.get(name, 0) + 1
    assert sorted(compared) == sorted(FAMILIES)
    assert {code for *_, code in refusals} <= {grpc.StatusCode.FAILED_PRECONDITION}
    assert {compose for _, compose, _ in refusals} <= {"position"}


def test_tenancy_bounds_and_registration_errors(tiny_repo: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("alice token-a\nbob token-b\n")
    with child_server(tiny_repo, "--auth-tokens", str(tokens)) as served, \
            channel(served.target) as ch, \
            CudaSharedMemoryRegion("a", 4096) as region:
        alice, bob = As(ch, "token-a"), As(ch, "token-b")
        alice("native", "RegisterCudaSharedMemory",
              pb.RegisterCudaSharedMemoryRequest(region=region.region_message()))
        out = pb.SharedMemoryOutput(region="a", cuda=True)
        request = pb.EmbedRequest(token_ids=pb.TokenIds(ids=IDS), output=out)
        assert bob.status("native", "Embed", request) == (
            grpc.StatusCode.NOT_FOUND, "CUDA region 'a' is not registered")
        assert bob.status("native", "RegisterCudaSharedMemory",
                          pb.RegisterCudaSharedMemoryRequest(region=region.region_message())
                          )[0] == grpc.StatusCode.PERMISSION_DENIED
        filled = torch.from_dlpack(region.rows("float32", [1024]))
        filled.fill_(1.5)
        too_long = pb.EmbedRequest(token_ids=pb.TokenIds(ids=[1] * 64),
                                   output=pb.SharedMemoryOutput(region="a", offset=64,
                                                                cuda=True))
        assert alice.status("native", "Embed", too_long) == (
            grpc.StatusCode.INVALID_ARGUMENT, "output: the output needs 4096 bytes at offset 64 "
            "but CUDA region 'a' has 4096 bytes; the largest T that fits is 63")
        assert bool((filled == 1.5).all())  # refused before any work: nothing written
        code, message = bob.status("native", "RegisterCudaSharedMemory",
                                   pb.RegisterCudaSharedMemoryRequest(
                                       region=pb.CudaSharedMemoryRegion(
                                           name="x", raw_handle=bytes(range(7, 71)),
                                           device_id=0, byte_size=64)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert message.startswith("raw_handle: cuIpcOpenMemHandle on device 0 refused it: "
                                  "CUDA_ERROR_"), message
        with CudaSharedMemoryRegion("b", 1 << 21) as other:
            big = other.region_message()
            big.byte_size = 1 << 30
            code, message = bob.status("native", "RegisterCudaSharedMemory",
                                       pb.RegisterCudaSharedMemoryRequest(region=big))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert re.fullmatch(r"byte_size=1073741824 exceeds the (\d+) bytes of the "
                                r"allocation raw_handle names", message), message
            beyond = other.region_message()
            beyond.device_id = 64
            code, message = bob.status("native", "RegisterCudaSharedMemory",
                                       pb.RegisterCudaSharedMemoryRequest(region=beyond))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert re.fullmatch(r"device_id=64: this server sees \d+ CUDA device\(s\) "
                                r"\(0\.\.\d+\)", message), message


def test_unregister_while_a_request_writes(tiny_repo: Path) -> None:
    """The request holds the region (and its mapping) until it has written; afterwards the
    name is gone."""
    with child_server(tiny_repo, "--max-batch-delay-us", "300000") as served, \
            channel(served.target) as ch, CudaSharedMemoryRegion("r", 4096) as region:
        me = As(ch)
        me("native", "RegisterCudaSharedMemory",
           pb.RegisterCudaSharedMemoryRequest(region=region.region_message()))
        request = pb.EmbedRequest(token_ids=pb.TokenIds(ids=IDS),
                                  output=pb.SharedMemoryOutput(region="r", cuda=True))
        in_flight = me.native.Embed.future(request, timeout=30)
        me("native", "UnregisterCudaSharedMemory", pb.UnregisterCudaSharedMemoryRequest(
            name="r"))
        assert in_flight.result().output.byte_size == len(IDS) * DIM * 4
        assert as_bytes(region.rows("float32", [len(IDS), DIM])) == me.embed()
        assert me.status("native", "Embed", request) == (
            grpc.StatusCode.NOT_FOUND, "CUDA region 'r' is not registered")


def test_rest_registration_is_the_grpc_fronts(gpu: ChildServer) -> None:
    """Triton's REST routes as tritonclient.http sends them (plain HTTP here: the GPU image
    has no tritonclient)."""
    def rest(method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", gpu.http_port, timeout=30)
        try:
            conn.request(method, path, json.dumps(body) if body is not None else None)
            reply = conn.getresponse()
            data = reply.read()
            return reply.status, json.loads(data) if data else None
        finally:
            conn.close()

    with CudaSharedMemoryRegion("rest", 4096) as region, channel(gpu.target) as ch:
        assert rest("POST", "/v2/cudasharedmemory/region/rest/register", {
            "raw_handle": {"b64": base64.b64encode(region.raw_handle).decode()},
            "device_id": 0, "byte_size": 4096}) == (200, None)
        assert rest("GET", "/v2/cudasharedmemory/status") == (
            200, [{"name": "rest", "device_id": 0, "byte_size": 4096}])
        me = As(ch)
        me("native", "Embed", pb.EmbedRequest(
            token_ids=pb.TokenIds(ids=IDS),
            output=pb.SharedMemoryOutput(region="rest", cuda=True)))
        assert as_bytes(region.rows("float32", [len(IDS), DIM])) == me.embed()
        assert rest("POST", "/v2/cudasharedmemory/region/rest/unregister") == (200, None)
        assert rest("GET", "/v2/cudasharedmemory/status") == (200, [])
