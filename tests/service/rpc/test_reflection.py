"""Server reflection answers ``file_containing_symbol`` for every method of every service
(``<package>.<service>.<method>``, what ``grpcurl describe`` sends), as for services and
types; an unknown method is NOT_FOUND."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from service.local import ServerHandle

SERVICES = ("embedding.v1.EmbeddingService", "inference.GRPCInferenceService",
            "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection")


@pytest.fixture(scope="module")
def reflect(server: ServerHandle) -> Iterator[reflection_pb2_grpc.ServerReflectionStub]:
    with grpc.insecure_channel(server.target) as channel:
        yield reflection_pb2_grpc.ServerReflectionStub(channel)


def ask(stub: reflection_pb2_grpc.ServerReflectionStub,
        symbol: str) -> reflection_pb2.ServerReflectionResponse:
    (answer,) = stub.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)]))
    return answer


def files(answer: reflection_pb2.ServerReflectionResponse
          ) -> list[descriptor_pb2.FileDescriptorProto]:
    """The file and its dependencies, as the answer carries them."""
    assert answer.WhichOneof("message_response") == "file_descriptor_response", answer
    return [descriptor_pb2.FileDescriptorProto.FromString(raw)
            for raw in answer.file_descriptor_response.file_descriptor_proto]


def methods(service: str, found: list[descriptor_pb2.FileDescriptorProto]) -> list[str]:
    """The service's methods, from the one file among ``found`` that declares it."""
    (declaring,) = [s for f in found for s in f.service if f"{f.package}.{s.name}" == service]
    return [m.name for m in declaring.method]


@pytest.mark.parametrize("service", SERVICES)
def test_every_method_resolves_to_its_services_file(
        reflect: reflection_pb2_grpc.ServerReflectionStub, service: str) -> None:
    whole = files(ask(reflect, service))
    names = methods(service, whole)
    assert names
    for method in names:
        assert files(ask(reflect, f"{service}.{method}")) == whole, method


@pytest.mark.parametrize("symbol", ["embedding.v1.EmbeddingService.Nope",
                                    "embedding.v1.Nope.Embed", "Embed", ""])
def test_unknown_symbols_are_not_found(reflect: reflection_pb2_grpc.ServerReflectionStub,
                                       symbol: str) -> None:
    answer = ask(reflect, symbol)
    assert answer.WhichOneof("message_response") == "error_response"
    assert answer.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
