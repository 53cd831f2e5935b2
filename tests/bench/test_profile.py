"""bench.suites.profile's attribution: an idle sample (the loop waiting, or another thread
with no frame of the service) is not counted, one inside a transport library is the
transport's, any other goes to the innermost frame of the service's own code on its stack,
by module, and to "transport" when the loop runs none."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.suites.profile import ORDER, TRANSPORT, stage_of, tally

_LOOP = "run_forever (asyncio/base_events.py:608);_run_once (asyncio/base_events.py:1922)"
_FRAME = "run (/srv/service/rpc/frame.py:95)"
_EMBED = "embed (/srv/service/engine/engine.py:97)"


@pytest.mark.parametrize(("stack", "stage"), [
    (_LOOP, TRANSPORT),
    (f"{_LOOP};select (selectors.py:468)", None),  # idle: not counted
    (f"{_LOOP};EpollSelector.select (selectors.py:468)", None),
    (f"{_LOOP};_grpc_unary (grpc/_cython/cygrpc.pyx:1)", TRANSPORT),
    # Another thread waiting (py-spy pauses the server, so it reports every thread):
    ("Thread._bootstrap (threading.py:1002);Thread.run (threading.py:982);"
     "_worker (concurrent/futures/thread.py:81)", None),  # a pool's idle worker
    ("Thread._bootstrap (threading.py:1002);Thread.run (threading.py:982)", None),  # grpcio
    # ... but a worker running the service's code is at work:
    ("Thread.run (threading.py:982);_worker (concurrent/futures/thread.py:83);"
     "_compute_batch (/srv/service/engine/batcher.py:250);"
     "embed_into (/srv/service/engine/tables.py:220)", "lookup"),
    (f"{_LOOP};{_FRAME}", "frame"),
    (f"{_LOOP};{_FRAME};inc (/srv/service/metrics.py:44)", "metrics"),
    (f"{_LOOP};{_FRAME};resolve (/srv/service/rpc/identity.py:80)", "auth"),
    (f"{_LOOP};{_FRAME};Embed (/srv/service/rpc/native.py:60)", "front"),
    (f"{_LOOP};{_FRAME};{_EMBED}", "hand-off"),
    (f"{_LOOP};{_FRAME};{_EMBED};admit (/srv/service/engine/admission.py:180);"
     "check_ids (/srv/service/engine/validation.py:90);amin (numpy/core/_methods.py:5)",
     "admission"),
    (f"{_LOOP};{_FRAME};{_EMBED};embed_into (/srv/service/engine/tables.py:220)", "lookup"),
    (f"{_LOOP};{_FRAME};{_EMBED};prepare (/srv/service/engine/replies.py:110)", "response"),
    (f"{_LOOP};{_FRAME};{_EMBED};finish (/srv/service/engine/rest_reply.py:135)", "response"),
    (f"{_LOOP};{_FRAME};{_EMBED};record (/srv/service/tracing.py:170)", "tracing"),
    (f"{_LOOP};{_FRAME};infer (/srv/service/rpc/http/front.py:300);"
     "send (/srv/service/rpc/http/send.py:50)", "response"),
    (f"{_LOOP};{_FRAME};infer (/srv/service/rpc/http/front.py:300);"
     "send (/srv/service/rpc/http/send.py:50);write (asyncio/selector_events.py:1057)",
     TRANSPORT),  # the socket write: the transport's, whoever called it
])
def test_a_sample_goes_to_its_innermost_service_frame(stack: str, stage: str | None) -> None:
    assert stage_of(stack) == stage


def test_tally_counts_samples_per_stage_in_order() -> None:
    raw = "\n".join([f"{_LOOP} 7", f"{_LOOP};{_FRAME} 2", f"{_LOOP};{_FRAME};{_EMBED} 5",
                     f"{_LOOP};{_FRAME};{_EMBED} 1", f"{_LOOP};select (selectors.py:468) 40",
                     "", "garbage line"])
    counts = tally(raw)
    assert list(counts) == ORDER
    assert counts == {**dict.fromkeys(ORDER, 0), TRANSPORT: 7, "frame": 2, "hand-off": 6}


# Engine and front modules that no request runs through once the server is up.
_NOT_ON_A_REQUEST = {"service/engine/__init__.py", "service/engine/kernel_build.py",
                     "service/engine/loading.py", "service/engine/pending_versions.py",
                     "service/engine/permissions.py", "service/engine/cuda_ipc.py",
                     "service/rpc/__init__.py", "service/rpc/http/__init__.py"}


def test_every_module_a_request_runs_has_a_stage() -> None:
    """A module added to the engine or a front is charged to its own stage, not to the
    transport or (through its caller) to another stage."""
    root = Path(__file__).resolve().parents[2]
    modules = {p.relative_to(root).as_posix()
               for d in ("service/engine", "service/rpc") for p in (root / d).rglob("*.py")}
    unstaged = sorted(m for m in modules - _NOT_ON_A_REQUEST
                      if stage_of(f"{_LOOP};f (/srv/{m}:1)") == TRANSPORT)
    assert unstaged == []
