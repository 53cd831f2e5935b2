"""What the host and the CUDA shared-memory registries share: regions by (owner, name).

A region belongs to the identity that registered it (``Caller.identity``, resolved by the
frame from the token or certificate; "" when auth is off: one namespace). Listing,
unregistering ("" = all of the caller's own) and writing see only the caller's regions,
so another identity's region is "not registered". Shared-memory calls are served to local
peers only unless ``allow_remote``; registrations are capped per identity and in all; a
write must fit the region from its offset, and the request's own byte bound. ``shm.py``
(``/dev/shm`` objects) and ``cuda_shm.py`` (device memory) add what opening one takes.
"""

from __future__ import annotations

import ipaddress
import threading
import urllib.parse
from typing import Generic, Protocol, TypeVar

from service.engine.shm_region import short
from service.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)

__all__ = ["MAX_NAME_CHARS", "Caller", "RegionTable", "check_name", "is_local_peer"]

MAX_NAME_CHARS = 128  # a region name's length
_LOCAL_SCHEMES = ("unix:", "unix-abstract:")


class Caller(Protocol):
    """Who asks (the frame's ``Call`` is one): the identity owning regions, the peer."""

    @property
    def identity(self) -> str: ...

    @property
    def peer(self) -> str: ...


class _Sized(Protocol):
    @property
    def byte_size(self) -> int: ...


R = TypeVar("R", bound=_Sized)


def is_local_peer(peer: str) -> bool:
    """A Unix socket or a loopback address (``ipv4:127.0.0.1:5``, ``ipv6:[::1]:5``, also
    percent-encoded as newer gRPC writes it)."""
    if peer.startswith(_LOCAL_SCHEMES):
        return True
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6"):
        return False
    host = urllib.parse.unquote(rest).rpartition(":")[0].strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def check_name(name: str) -> None:
    """A region name: printable, at most MAX_NAME_CHARS characters."""
    if not name:
        raise InvalidArgument("region name is empty")
    if len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise InvalidArgument(f"region name {short(name)} must be printable and at most "
                              f"{MAX_NAME_CHARS} characters")


class RegionTable(Generic[R]):
    """Regions of one kind by (owner, name); safe from the event loop and compute thread."""

    kind = ""  # how messages name a region of this table: "" (host) or "CUDA "

    def __init__(self, allow_remote: bool, max_per_identity: int, max_regions: int) -> None:
        self.allow_remote = allow_remote
        self.max_per_identity = max_per_identity
        self.max_regions = max_regions
        self._regions: dict[tuple[str, str], R] = {}
        self._lock = threading.Lock()

    def check_peer(self, caller: Caller) -> None:
        """PERMISSION_DENIED for a non-local peer unless remote use is allowed."""
        if not self.allow_remote and not is_local_peer(caller.peer):
            raise PermissionDenied(
                "shared-memory calls are served to local peers only (loopback or a Unix "
                "socket); this peer is not local (the server's --shm-allow-remote enables "
                "them)")

    def _check_room(self, owner: str, name: str, taken: bool = False) -> None:
        """ALREADY_EXISTS for a name in use (``taken``: by another table), else
        RESOURCE_EXHAUSTED past either cap (call with the lock held)."""
        if (owner, name) in self._regions or taken:
            raise AlreadyExists(f"region {short(name)} is already registered; unregister it "
                                f"first")
        mine = sum(1 for o, _ in self._regions if o == owner)
        if mine >= self.max_per_identity:
            raise ResourceExhausted(f"{mine} {self.kind}regions registered by this client: "
                                    f"max_shm_regions_per_identity={self.max_per_identity}; "
                                    f"unregister one first")
        if len(self._regions) >= self.max_regions:
            raise ResourceExhausted(f"{len(self._regions)} {self.kind}regions registered: "
                                    f"max_shm_regions={self.max_regions}; retry later")

    def owns(self, caller: Caller, name: str) -> bool:
        """Whether ``name`` is one of the caller's regions of this table."""
        return bool(name) and (caller.identity, name) in self._regions

    def unregister(self, caller: Caller, name: str) -> None:
        """Forget one of the caller's regions ("" = every one of the caller's own);
        requests in flight keep theirs until they finish."""
        self.check_peer(caller)
        with self._lock:
            if not name:
                for key in [k for k in self._regions if k[0] == caller.identity]:
                    del self._regions[key]
            elif self._regions.pop((caller.identity, name), None) is None:
                raise NotFound(f"{self.kind}region {short(name)} is not registered")

    def regions(self, caller: Caller, name: str = "") -> list[R]:
        """The caller's registered regions, or the one named."""
        self.check_peer(caller)
        with self._lock:
            if not name:
                return [r for (owner, _), r in sorted(self._regions.items())
                        if owner == caller.identity]
            region = self._regions.get((caller.identity, name))
        if region is None:
            raise NotFound(f"{self.kind}region {short(name)} is not registered")
        return [region]

    def _fitting(self, caller: Caller, name: str, offset: int, shape: tuple[int, ...],
                 itemsize: int, field: str, byte_size: int | None) -> tuple[R, int]:
        """The caller's region ``name`` and the bytes ``shape`` takes, checked to fit from
        ``offset`` within the region and within ``byte_size`` (the request's own bound)."""
        if not name:  # "" lists every region elsewhere; here it names none
            raise InvalidArgument(f"{field}.region is empty: name a registered region")
        (region,) = self.regions(caller, name)
        nbytes = itemsize
        for n in shape:
            nbytes *= n
        limit = region.byte_size - offset
        what = f"{self.kind}region {short(name)} has {region.byte_size} bytes"
        if byte_size is not None and byte_size < limit:
            limit, what = byte_size, f"the request allows {byte_size} bytes"
        if offset < 0 or nbytes > limit:
            row = nbytes // max(1, shape[-2]) if len(shape) >= 2 else nbytes
            raise InvalidArgument(
                f"{field}: the output needs {nbytes} bytes at offset {offset} but {what}; "
                f"the largest T that fits is {max(0, limit) // max(1, row)}")
        return region, nbytes
