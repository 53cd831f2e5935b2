"""Helpers of the shared-memory and repository security tests: raw stubs that act as a
given identity, /dev/shm objects the test never maps (so shrinking one cannot hurt the
test process either), and checkpoints edited on disk the way a careless operator would."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from genproto.inference.v2 import grpc_service_pb2 as oip
from genproto.inference.v2 import grpc_service_pb2_grpc as oip_grpc
from service.format.manifest import EMBEDDINGS_FILE, MANIFEST_FILE
from tests.tiny_model import DIM, tiny_tables

SHM = Path("/dev/shm")
IDS = [31373, 995, 0, 50256, 7, 11]
ROW_BYTES = len(IDS) * DIM * 4  # IDS' rows in float32


class ShmObject:
    """A /dev/shm object of ``size`` zero bytes, read with pread, never mapped here."""

    def __init__(self, size: int) -> None:
        self.key = f"/embed-sec-{secrets.token_hex(6)}"
        self.path = SHM / self.key[1:]
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)

    def read(self, offset: int = 0, size: int | None = None) -> bytes:
        """The object's bytes (all of them from ``offset`` by default)."""
        with self.path.open("rb") as f:
            f.seek(offset)
            return f.read(size if size is not None else -1)

    def close(self) -> None:
        """Unlink it."""
        self.path.unlink(missing_ok=True)


MakeObject = Callable[[int], ShmObject]  # the ``objects`` fixture: size -> a new object


class As:
    """Raw native and OIP stubs on one channel, every call carrying one bearer token."""

    def __init__(self, channel: grpc.Channel, token: str = "") -> None:
        self.native = pb_grpc.EmbeddingServiceStub(channel)
        self.oip = oip_grpc.GRPCInferenceServiceStub(channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()

    @classmethod
    @contextmanager
    def at(cls, target: str, token: str = "") -> Iterator[As]:
        """The identity on a channel of its own to ``target``, closed on leaving."""
        with channel(target) as ch:
            yield cls(ch, token)

    def __call__(self, stub: str, method: str, request: Any) -> Any:
        """The response, or raise grpc.RpcError."""
        return getattr(getattr(self, stub), method)(request, metadata=self.metadata, timeout=30)

    def status(self, stub: str, method: str, request: Any) -> tuple[grpc.StatusCode, str]:
        """(code, details) of a call that must fail."""
        with pytest.raises(grpc.RpcError) as info:
            self(stub, method, request)
        return info.value.code(), info.value.details()

    def register(self, name: str, obj: ShmObject, offset: int = 0,
                 byte_size: int | None = None) -> Any:
        """RegisterSharedMemory of ``obj`` (all of it from ``offset``) as ``name``."""
        size = obj.path.stat().st_size - offset if byte_size is None else byte_size
        return self("native", "RegisterSharedMemory", pb.RegisterSharedMemoryRequest(
            region=pb.SharedMemoryRegion(name=name, key=obj.key, offset=offset,
                                         byte_size=size)))

    def names(self) -> list[str]:
        """The regions this identity sees (native ListSharedMemory)."""
        response = self("native", "ListSharedMemory", pb.ListSharedMemoryRequest())
        return [r.name for r in response.regions]

    def embed_into(self, region: str, offset: int = 0, ids: list[int] | None = None) -> Any:
        """Embed ``ids`` (fp32) into ``region`` at ``offset``."""
        return self("native", "Embed", pb.EmbedRequest(
            token_ids=pb.TokenIds(ids=ids or IDS),
            output=pb.SharedMemoryOutput(region=region, offset=offset)))

    def embed(self, ids: list[int] | None = None) -> bytes:
        """Embed ``ids`` (fp32) through the response: the exact bytes."""
        response = self("native", "Embed", pb.EmbedRequest(token_ids=pb.TokenIds(
            ids=ids or IDS)))
        data: bytes = response.embeddings.data
        return data


def infer_shm(region: str, byte_size: int | None, offset: int = 0,
              ids: list[int] | None = None) -> oip.ModelInferRequest:
    """A ModelInfer with the embeddings put in ``region``, as tritonclient's
    ``set_shared_memory(region, byte_size, offset)`` sends it."""
    ids = ids or IDS
    request = oip.ModelInferRequest(model_name="tiny", inputs=[
        oip.ModelInferRequest.InferInputTensor(name="input_ids", datatype="INT64",
                                               shape=[1, len(ids)])])
    request.inputs[0].contents.int64_contents.extend(ids)
    out = request.outputs.add(name="embeddings")
    out.parameters["shared_memory_region"].string_param = region
    if byte_size is not None:
        out.parameters["shared_memory_byte_size"].int64_param = byte_size
    if offset:
        out.parameters["shared_memory_offset"].int64_param = offset
    return request


def expected_rows(ids: list[int], seed: int = 0, start_position: int = 0) -> bytes:
    """fp32 rows of the tiny model of ``seed``: token row + position row."""
    token_table, position_table = tiny_tables(seed)
    rows = token_table[torch.tensor(ids)] + position_table[start_position:
                                                           start_position + len(ids)]
    return rows.contiguous().view(torch.uint8).numpy().tobytes()


def non_loopback_address() -> str | None:
    """An address of this host that is not loopback (no packet is sent), or None."""
    for probe in ("192.0.2.1", "10.255.255.255", "8.8.8.8"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((probe, 9))
            except OSError:
                continue
            address: str = s.getsockname()[0]
            if not address.startswith("127."):
                return address
    return None


@contextmanager
def channel(target: str) -> Iterator[grpc.Channel]:
    """An insecure channel to ``target``."""
    with grpc.insecure_channel(target) as ch:
        yield ch


def rewrite_entry(version_dir: Path, name: str, data: bytes) -> None:
    """Replace one file of a version and update its sha256 in the manifest, so the
    version is hash-consistent and only its content is wrong."""
    (version_dir / name).write_bytes(data)
    edit_manifest(version_dir, lambda m: m["files"].__setitem__(
        name, hashlib.sha256(data).hexdigest()))


def edit_manifest(version_dir: Path, change: Callable[[dict[str, Any]], object]) -> None:
    """Apply ``change`` to manifest.json's parsed content and write it back."""
    path = version_dir / MANIFEST_FILE
    manifest = json.loads(path.read_bytes())
    change(manifest)
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def safetensors_with_header(header: Any, payload: bytes = b"") -> bytes:
    """A safetensors-shaped file whose JSON header is ``header`` (any JSON value)."""
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw + payload


__all__ = ["DIM", "EMBEDDINGS_FILE", "IDS", "ROW_BYTES", "As", "MakeObject", "ShmObject",
           "channel", "edit_manifest", "expected_rows", "infer_shm", "non_loopback_address",
           "rewrite_entry", "safetensors_with_header"]
