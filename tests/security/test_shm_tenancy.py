"""Shared-memory regions belong to the identity that registered them: another client can
neither list, write into, nor unregister them (``UnregisterSharedMemory("")`` included);
the request's own byte size bounds every write; registrations are capped; keys and names
are checked; non-local peers are refused unless allowed."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.inference.v2 import grpc_service_pb2 as oip
from service.engine.regions import is_local_peer
from service.local import ServerHandle
from tests.security.shm_helpers import (
    IDS,
    ROW_BYTES,
    As,
    MakeObject,
    channel,
    expected_rows,
    infer_shm,
    non_loopback_address,
)
from tests.tiny_model import start

TOKENS = {"alice": "token-a", "bob": "token-b"}


@pytest.fixture(scope="module")
def tenants(tiny_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    """A server with two identities from a token file, at most 3 regions each."""
    tokens = tmp_path_factory.mktemp("auth") / "tokens"
    tokens.write_text("".join(f"{name} {token}\n" for name, token in TOKENS.items()))
    with start(tiny_repo, auth_tokens=str(tokens), max_shm_regions_per_identity=3,
               max_shm_regions=5) as handle:
        yield handle


def test_clients_see_only_their_own_regions(tenants: ServerHandle,
                                            objects: MakeObject) -> None:
    a_obj, b_obj = objects(4096), objects(4096)
    with channel(tenants.target) as ch:
        alice, bob = As(ch, TOKENS["alice"]), As(ch, TOKENS["bob"])
        alice.register("a1", a_obj)
        bob.register("b1", b_obj)
        bob.register("a1", objects(4096))  # names are per identity: no clash
        assert alice.names() == ["a1"]
        assert sorted(bob.names()) == ["a1", "b1"]
        # OIP status: the same view.
        status = bob("oip", "SystemSharedMemoryStatus", oip.SystemSharedMemoryStatusRequest())
        assert sorted(status.regions) == ["a1", "b1"]
        assert bob("oip", "SystemSharedMemoryStatus", oip.SystemSharedMemoryStatusRequest(
            name="a1")).regions["a1"].key != a_obj.key
        # B cannot write into A's region, unregister it, or remove it with "".
        alice("native", "UnregisterSharedMemory", pb.UnregisterSharedMemoryRequest(name="a1"))
        alice.register("only-alice", a_obj)
        assert bob.status("native", "Embed", pb.EmbedRequest(
            token_ids=pb.TokenIds(ids=IDS), output=pb.SharedMemoryOutput(region="only-alice"))
        ) == (grpc.StatusCode.NOT_FOUND, "region 'only-alice' is not registered")
        assert bob.status("oip", "ModelInfer", infer_shm("only-alice", None))[0] == \
            grpc.StatusCode.NOT_FOUND
        assert bob.status("native", "UnregisterSharedMemory", pb.UnregisterSharedMemoryRequest(
            name="only-alice"))[0] == grpc.StatusCode.NOT_FOUND
        assert bob.status("oip", "SystemSharedMemoryUnregister",
                          oip.SystemSharedMemoryUnregisterRequest(name="only-alice"))[0] == \
            grpc.StatusCode.NOT_FOUND
        bob("native", "UnregisterSharedMemory", pb.UnregisterSharedMemoryRequest(name=""))
        bob("oip", "SystemSharedMemoryUnregister", oip.SystemSharedMemoryUnregisterRequest())
        assert bob.names() == []
        assert alice.names() == ["only-alice"]  # untouched by B's "" unregister
        assert a_obj.read(0, ROW_BYTES) == b"\0" * ROW_BYTES  # B never wrote into it
        alice.embed_into("only-alice")
        assert a_obj.read(0, ROW_BYTES) == expected_rows(IDS)
        # B cannot register A's object under a name of its own either.
        code, message = bob.status("native", "RegisterSharedMemory",
                                   pb.RegisterSharedMemoryRequest(region=pb.SharedMemoryRegion(
                                       name="steal", key=a_obj.key, byte_size=64)))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "registered by another client" in message
        alice("native", "UnregisterSharedMemory", pb.UnregisterSharedMemoryRequest())
        assert alice.names() == []


def test_without_a_token_nothing_is_served(tenants: ServerHandle) -> None:
    with channel(tenants.target) as ch:
        for who in (As(ch), As(ch, "token-x")):
            assert who.status("native", "ListSharedMemory", pb.ListSharedMemoryRequest())[0] \
                == grpc.StatusCode.UNAUTHENTICATED


def test_registrations_are_capped_never_internal(tenants: ServerHandle,
                                                 objects: MakeObject) -> None:
    """Thousands of registrations: RESOURCE_EXHAUSTED past the cap, never INTERNAL; the
    cap is per identity (and in all), and freeing a region makes room again."""
    obj = objects(64)
    with channel(tenants.target) as ch:
        alice, bob = As(ch, TOKENS["alice"]), As(ch, TOKENS["bob"])
        codes: dict[grpc.StatusCode, int] = {}
        details = set()
        for i in range(1000):
            try:
                alice.register(f"r{i}", obj)
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code, detail = e.code(), e.details()
                details.add(detail)
            codes[code] = codes.get(code, 0) + 1
        assert codes == {grpc.StatusCode.OK: 3, grpc.StatusCode.RESOURCE_EXHAUSTED: 997}
        assert details == {"3 regions registered by this client: "
                           "max_shm_regions_per_identity=3; unregister one first"}
        # Bob still has room of his own, up to the total of 5.
        other = objects(64)
        bob.register("b0", other)
        bob.register("b1", other)
        code, message = bob.status("native", "RegisterSharedMemory",
                                   pb.RegisterSharedMemoryRequest(region=pb.SharedMemoryRegion(
                                       name="b2", key=other.key, byte_size=64)))
        assert (code, "max_shm_regions=5" in message) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED, True)
        alice("native", "UnregisterSharedMemory", pb.UnregisterSharedMemoryRequest(name="r0"))
        bob.register("b2", other)
        for who in (alice, bob):
            who("native", "UnregisterSharedMemory", pb.UnregisterSharedMemoryRequest())


def test_request_byte_size_bounds_the_write(server: ServerHandle,
                                            objects: MakeObject) -> None:
    """``shared_memory_byte_size`` is honoured as Triton does: 16 allowed → nothing is
    written past them (the whole request is refused before any work)."""
    obj = objects(4096)
    with As.at(server.target) as client:
        client("oip", "SystemSharedMemoryRegister", oip.SystemSharedMemoryRegisterRequest(
            name="bounded", key=obj.key, offset=0, byte_size=4096))
        try:
            code, message = client.status("oip", "ModelInfer", infer_shm("bounded", 16))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert message == (f"outputs['embeddings']: the output needs {ROW_BYTES} bytes at "
                               f"offset 0 but the request allows 16 bytes; the largest T "
                               f"that fits is 0")
            assert obj.read() == b"\0" * 4096
            # Past the region's end from an offset: refused too.
            code, _ = client.status("oip", "ModelInfer", infer_shm("bounded", None, 4000))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert obj.read() == b"\0" * 4096
            # Exactly enough: written, and nothing after.
            client("oip", "ModelInfer", infer_shm("bounded", ROW_BYTES, 8))
            assert obj.read(8, ROW_BYTES) == expected_rows(IDS)
            assert obj.read(8 + ROW_BYTES) == b"\0" * (4096 - 8 - ROW_BYTES)
            code, _ = client.status("oip", "ModelInfer", infer_shm("bounded", -1))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
        finally:
            client("oip", "SystemSharedMemoryUnregister",
                   oip.SystemSharedMemoryUnregisterRequest(name="bounded"))


@pytest.mark.parametrize("key", ["/a\0b", "/a b", "/caf\u00e9", "/" + "x" * 300, "/a\nb", "",
                                 "/dev/../x", "//x"])
def test_odd_keys_are_invalid_argument_without_a_traceback(
        server: ServerHandle, key: str, caplog: pytest.LogCaptureFixture) -> None:
    with As.at(server.target) as client, caplog.at_level(logging.ERROR):
        for stub, method, request in (
                ("native", "RegisterSharedMemory", pb.RegisterSharedMemoryRequest(
                    region=pb.SharedMemoryRegion(name="k", key=key, byte_size=8))),
                ("oip", "SystemSharedMemoryRegister", oip.SystemSharedMemoryRegisterRequest(
                    name="k", key=key, byte_size=8))):
            code, message = client.status(stub, method, request)
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert len(message) < 300
    assert not [r for r in caplog.records if r.exc_info]


@pytest.mark.parametrize("name", ["a\0b", "line\nbreak", "x" * 129])
def test_odd_region_names_are_invalid_argument(server: ServerHandle, name: str,
                                               objects: MakeObject) -> None:
    obj = objects(64)
    with As.at(server.target) as client:
        assert client.status("native", "RegisterSharedMemory", pb.RegisterSharedMemoryRequest(
            region=pb.SharedMemoryRegion(name=name, key=obj.key, byte_size=8)))[0] == \
            grpc.StatusCode.INVALID_ARGUMENT


def test_fifo_is_not_a_region(server: ServerHandle) -> None:
    fifo = Path("/dev/shm") / f"embed-sec-fifo-{secrets.token_hex(4)}"
    os.mkfifo(fifo)
    try:
        with As.at(server.target) as client:
            code, message = client.status("native", "RegisterSharedMemory",
                                          pb.RegisterSharedMemoryRequest(region=pb.SharedMemoryRegion(
                                              name="f", key=f"/{fifo.name}", byte_size=8)))
        assert (code, "not a regular file" in message) == (grpc.StatusCode.INVALID_ARGUMENT, True)
    finally:
        fifo.unlink()


def test_local_peers() -> None:
    for peer in ("ipv4:127.0.0.1:5000", "ipv4:127.3.4.5:1", "ipv6:[::1]:5000",
                 "ipv6:%5B::1%5D:5000", "unix:/tmp/s", "unix-abstract:x",
                 "ipv6:[::ffff:127.0.0.1]:80"):
        assert is_local_peer(peer), peer
    for peer in ("ipv4:10.0.0.1:5000", "ipv6:[fd00::2]:1", "ipv6:%5Bfd00::2%5D:1", "",
                 "ipv4:garbage", "vsock:1"):
        assert not is_local_peer(peer), peer


def test_non_local_peers_are_refused_unless_allowed(tiny_repo: Path,
                                                    objects: MakeObject) -> None:
    address = non_loopback_address()
    if address is None:  # a host with loopback only: nothing remote to come from
        address = "127.0.0.1"
    obj = objects(4096)
    for allow in (False, True):
        with start(tiny_repo, host="0.0.0.0", shm_allow_remote=allow) as handle, \
                As.at(f"{address}:{handle.grpc_port}") as client:
            remote = not address.startswith("127.")
            calls = [("native", "RegisterSharedMemory", pb.RegisterSharedMemoryRequest(
                         region=pb.SharedMemoryRegion(name="r", key=obj.key, byte_size=4096))),
                     ("native", "ListSharedMemory", pb.ListSharedMemoryRequest()),
                     ("oip", "SystemSharedMemoryStatus", oip.SystemSharedMemoryStatusRequest()),
                     ("native", "Embed", pb.EmbedRequest(token_ids=pb.TokenIds(ids=IDS),
                                                         output=pb.SharedMemoryOutput(region="r"))),
                     ("native", "UnregisterSharedMemory", pb.UnregisterSharedMemoryRequest())]
            for stub, method, request in calls:
                if remote and not allow:
                    code, message = client.status(stub, method, request)
                    assert code == grpc.StatusCode.PERMISSION_DENIED, method
                    assert "--shm-allow-remote" in message
                else:
                    client(stub, method, request)
            assert client.embed() == expected_rows(IDS)  # the rest is served to anyone
