"""The one launcher: a server that dies says why, and /proc is read right."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from bench.harness import launch as launcher
from bench.harness.launch import cpu_seconds, free_port, launch, memory_mb, wait_serving


def test_a_server_that_exits_before_serving_is_reported_with_its_log(tmp_path: Path) -> None:
    server = launch("broken", [sys.executable, "-c", "print('no model here'); exit(3)"],
                    free_port(), tmp_path)
    with pytest.raises(RuntimeError) as e:
        wait_serving(server, timeout_s=60)
    assert str(e.value).startswith("broken exited with 3; log:\n")
    assert "no model here" in str(e.value)
    assert (tmp_path / "broken.log").read_text() == "no model here\n"


def test_a_server_that_never_serves_times_out_with_its_log(tmp_path: Path) -> None:
    server = launch("silent", [sys.executable, "-c", "import time; print('up'); time.sleep(60)"],
                    free_port(), tmp_path)
    try:
        with pytest.raises(TimeoutError, match="silent not SERVING in time; log:\nup"):
            wait_serving(server, timeout_s=1.5)
    finally:
        server.proc.kill()
        server.proc.wait()


def test_proc_figures_of_this_process() -> None:
    spent = cpu_seconds(os.getpid())
    sum(i * i for i in range(3_000_000))  # ~0.2 s of CPU
    assert cpu_seconds(os.getpid()) > spent
    rss, pss = memory_mb(os.getpid()), memory_mb(os.getpid(), "Pss")
    assert 10 < pss <= rss < 100_000
    assert memory_mb(2**22 + 12345) == 0.0  # no such process


def test_free_port_never_hands_out_a_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    ports = iter([41000, 41000, 41000, 41001])  # a kernel may give a released port again

    class Reissuing:
        def __init__(self, *args: object) -> None:
            self.port = next(ports)

        def __enter__(self) -> Reissuing:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def bind(self, address: tuple[str, int]) -> None:
            pass

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(launcher, "_HANDED_OUT", set())
    monkeypatch.setattr(launcher.socket, "socket", Reissuing)
    assert [free_port(), free_port()] == [41000, 41001]


def test_a_reference_server_refuses_a_port_another_server_holds(tmp_path: Path) -> None:
    """grpcio sets SO_REUSEPORT by default: two servers would share one port and split
    its calls. A reference server must fail instead."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = launch("ceiling", [sys.executable, "-m", "bench.servers.ceiling", "--port",
                                    str(port), "--dim", "8"], port, tmp_path)
        with pytest.raises(RuntimeError) as e:
            wait_serving(server, timeout_s=60)
    assert f"ceiling: could not bind 127.0.0.1:{port}" in str(e.value)
