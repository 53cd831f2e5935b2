"""Host bytes behind the CUDA registry's opener contract, for the tests that run its logic
and its device write on a machine without a GPU.

``cuda_shm.CudaSharedMemoryRegistry`` opens a handle through an ``opener`` (the CUDA
runtime's IPC in the server); everything after that (names, tenancy, bounds, the plan and
the device write) only needs the opened memory as a tensor. ``HostOpener`` hands out
host-backed memory instead, so those parts run here on CPU tables, exactly the code a GPU
runs; what it cannot show (``cudaIpcOpenMemHandle``, the device's own stores) is in the
gpu-marked tests.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from service.engine.cuda_shm import CudaSharedMemoryRegistry
from service.engine.shm import SharedMemoryRegistry
from service.local import ServerHandle
from tests.tiny_model import start

__all__ = ["HANDLE", "HostMemory", "HostOpener", "Who", "fake_driver", "handle",
           "host_backed_server", "registry"]


class HostMemory:
    """An "allocation" of ``size`` host bytes (zeroed), as ``cuda_ipc.IpcMapping`` offers
    its device bytes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.bytes = torch.zeros(size, dtype=torch.uint8)  # (size,)

    def tensor(self) -> torch.Tensor:
        return self.bytes


@dataclass
class HostOpener:
    """Opens every handle as ``size`` host bytes; records each open."""

    size: int = 1 << 16
    opened: list[tuple[bytes, int, int]] = field(default_factory=list)
    memory: dict[bytes, HostMemory] = field(default_factory=dict)

    def __call__(self, raw: bytes, device: int, byte_size: int) -> HostMemory:
        self.opened.append((raw, device, byte_size))
        memory = self.memory[raw] = HostMemory(self.size)
        return memory


@dataclass(frozen=True)
class Who:
    """A caller: its identity and transport peer (the frame's Call has both)."""

    identity: str = ""
    peer: str = "ipv4:127.0.0.1:5000"


def handle(n: int) -> bytes:
    """A distinct 64-byte handle per ``n``."""
    return bytes([n % 251 + 1]) * 64


HANDLE = handle(1)


def registry(opener: HostOpener, host: SharedMemoryRegistry | None = None,
             **limits: int) -> CudaSharedMemoryRegistry:
    """A registry that believes its tables are on cuda:0 and opens handles as host bytes."""
    return CudaSharedMemoryRegistry(torch.device("cuda", 0), host=host, opener=opener,
                                    **limits)


@contextmanager
def host_backed_server(repo: Path, max_per_identity: int | None = None, **settings: object
                       ) -> Iterator[tuple[ServerHandle, HostOpener]]:
    """A real server over ``repo`` whose CUDA registry opens handles as host bytes: every
    front's CUDA path, request to region, without a GPU. ``max_per_identity`` caps each
    caller's CUDA regions (the registry's default without)."""
    limits = {} if max_per_identity is None else {"max_per_identity": max_per_identity}
    with start(repo, **settings) as server:
        opener = HostOpener()
        server.server.engine.cuda_shm = registry(opener, server.server.engine.shm, **limits)
        yield server, opener


def fake_driver(out_dir: Path) -> Path:
    """``fake_cuda_driver.c`` built as a shared library: the driver's entry points with their
    C signatures, for the ctypes layers' tests (see the source)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "a C compiler (gcc) is needed: scripts/apt_install.sh installs it"
    out = out_dir / "libfakecuda.so"
    source = Path(__file__).with_name("fake_cuda_driver.c")
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(source)],
                   check=True, capture_output=True, timeout=60)
    return out
