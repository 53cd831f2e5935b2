"""The descriptor pool server reflection reads, with method names resolved.

The reflection protocol takes ``<package>.<service>.<method>`` as a symbol
(``file_containing_symbol``), and ``grpcurl describe <service>.<method>`` sends exactly
that. protobuf's upb pool, which grpcio-reflection asks, finds services and messages but
not methods (grpc/grpc#34743), so the method's lookup answered NOT_FOUND. Here a method
resolves to its service's file; every other lookup is the pool's own.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FileDescriptor

__all__ = ["ReflectionPool"]


class ReflectionPool:
    """``descriptor_pool.Default()`` as grpcio-reflection uses it, methods included."""

    def __init__(self, pool: descriptor_pool.DescriptorPool | None = None) -> None:
        self._pool = pool if pool is not None else descriptor_pool.Default()

    def FindFileContainingSymbol(self, symbol: str) -> FileDescriptor:  # the pool's name
        """The file that declares ``symbol``: a method's is its service's."""
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            service, _, method = symbol.rpartition(".")
            try:
                found = self._pool.FindServiceByName(service)
            except KeyError:
                raise KeyError(symbol) from None
            if method not in found.methods_by_name:
                raise KeyError(symbol) from None
            return found.file

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)
