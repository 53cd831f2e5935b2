"""The engine: one object every front holds, and one call per request.

``server.py`` builds it once (repository, admission, batcher, shared-memory registry,
limits, draining state) and hands it to each front. A front translates its wire into a
``Request`` (options, inputs, the ``Reply`` its answer is laid out in, who asks, by when)
and awaits ``Engine.embed``: the answer, ready for its transport, or one typed error
(``service.errors``). Everything between is here, once for every front:

    admit (whole size, tokenize, validate) → room in the queue → the reply's layout →
    room in the answer budget (streams, REST) → the destination (response bytes or a
    shared-memory region) → the batcher's lookup into it → metrics, tracing → answer

The engine never calls into ``service/rpc``; its other entry points answer the requests
that do no lookup (``tokenize``, ``detokenize``, ``read``, ``model``) and the
shared-memory registry (``shm``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import numpy as np

from service import tracing
from service.dtypes import BY_WIRE
from service.engine.admission import Admission, Admitted, Input, Options
from service.engine.batcher import Batcher, Timing
from service.engine.budgets import Hold
from service.engine.cuda_plan import CudaPlan
from service.engine.cuda_shm import CudaSharedMemoryRegistry
from service.engine.loading import LoadedModel
from service.engine.regions import Caller
from service.engine.replies import Reply, padded_shape
from service.engine.repository import Repository
from service.engine.shm import SharedMemoryRegistry
from service.engine.shm_plan import ShmPlan
from service.engine.validation import Limits, check_ids, check_text
from service.metrics import Metrics

__all__ = ["Engine", "Request"]

R = TypeVar("R")


class Request(Generic[R]):
    """One embedding request as every front hands it to the engine (a plain class with
    slots: one is built per request)."""

    __slots__ = ("caller", "deadline", "hold", "inputs", "options", "reply", "request_id",
                 "start_ns")

    def __init__(self, options: Options, inputs: Sequence[Input], reply: Reply[R],
                 start_ns: int, deadline: float | None = None, request_id: str = "",
                 caller: Caller | None = None, hold: Hold | None = None) -> None:
        self.options = options
        self.inputs = inputs
        self.reply = reply  # the answer's layout, and where the rows go
        self.start_ns = start_ns  # perf_counter_ns() when it arrived: total_ns from here
        self.deadline = deadline  # time.monotonic() seconds; None = no deadline
        self.request_id = request_id  # for traces
        self.caller = caller  # who asks: owns the shared-memory region named, if any
        self.hold = hold  # the answer's place in an unsent-bytes budget, if any


class _Slice:
    """Rows of one sequence inside a padded [B, T, C] output, as a destination of their
    own; the owner of the whole output is finished once all of them are written."""

    __slots__ = ("rows",)

    def __init__(self, rows: Any) -> None:
        self.rows = rows  # (T, C) view of the whole output

    def finish(self, timing: Timing) -> Timing:
        del self.rows
        return timing


class Engine:
    """Admission, batching and shared memory, shared by the native, OIP and REST fronts."""

    def __init__(self, repo: Repository, batcher: Batcher, metrics: Metrics, limits: Limits,
                 tokenize_pool: ThreadPoolExecutor,
                 shm: SharedMemoryRegistry | None = None,
                 cuda_shm: CudaSharedMemoryRegistry | None = None) -> None:
        self.repo = repo
        self.batcher = batcher
        self.metrics = metrics
        self.limits = limits
        self.shm = shm if shm is not None else SharedMemoryRegistry()
        # CUDA regions (one namespace with ``shm``): refused unless the tables are on a GPU
        self.cuda_shm = cuda_shm if cuda_shm is not None else CudaSharedMemoryRegistry(
            repo.device, self.shm)
        self.admission = Admission(repo, limits, tokenize_pool, metrics)
        self.draining = False  # set once on SIGTERM: every front refuses new work

    @property
    def ready(self) -> bool:
        """A model is loaded and the server is not draining."""
        return bool(self.repo.models) and not self.draining

    def model(self, name: str, version: int = 0) -> LoadedModel:
        """A loaded model version ("" = default, 0 = newest), or NOT_FOUND/UNAVAILABLE."""
        return self.repo.get(name, version)

    async def embed(self, request: Request[R]) -> R:
        """The request's rows, looked up into its reply; returns the answer."""
        admitted = await self.admission.admit(request.options, request.inputs)
        # Room in the queue before any output is allocated: a refusal costs nothing more.
        self.batcher.check_room(admitted.tokens)
        reply = request.reply
        untrained = (self.admission.untrained_per_sequence(admitted)
                     if reply.reports_untrained else None)
        nbytes = reply.prepare(admitted, untrained)
        if request.hold is not None:
            await request.hold.take(nbytes)
        plan = None
        if reply.region is not None:
            plan = self._plan_region(admitted, reply, request.caller)
        dest = reply.destination(plan)
        lengths = admitted.lengths
        if not reply.padded or len(set(lengths)) == 1 or isinstance(plan, CudaPlan):
            # one job: every row is written (a CUDA region pads by the device itself)
            job = admitted.job(dest, request.start_ns, request.deadline)
            result = await self.batcher.submit(job)
            self.admission.account(admitted, job)
            tracing.record(admitted, job, request.request_id)
            return result
        return await self._padded(admitted, dest, request)

    def _plan_region(self, admitted: Admitted, reply: Reply[Any],
                     caller: Caller | None) -> ShmPlan | CudaPlan:
        """The rows' place in the caller's region: a host region, or a CUDA one (named so
        by the request, or, where it does not say, by the region's name)."""
        assert caller is not None, "a region is named on behalf of a caller"
        assert reply.region is not None
        out = reply.region
        shape = padded_shape(admitted, reply.padded)
        cuda = self.cuda_shm.owns(caller, out.name) if out.cuda is None else out.cuda
        registry: SharedMemoryRegistry | CudaSharedMemoryRegistry = (
            self.cuda_shm if cuda else self.shm)
        return registry.plan(caller, out.name, out.offset, shape,
                             BY_WIRE[admitted.options.dtype].torch, out.field, out.byte_size)

    async def _padded(self, admitted: Admitted, dest: Any, request: Request[Any]) -> Any:
        """Sequences of different T into [B, T, C] rows, rows past each sequence's length
        zeroed: one job per sequence into its slice, then ``dest`` is finished."""
        lengths = admitted.lengths
        rows = dest.rows.view(len(lengths), max(lengths), admitted.dim)  # (B, T, C)
        for b, n in enumerate(lengths):
            rows[b, n:].zero_()  # (T - n, C) padding
        jobs = [admitted.job(_Slice(rows[b, :n]), request.start_ns, request.deadline, [seq])
                for b, (n, seq) in enumerate(zip(lengths, admitted.sequences))]
        timings = await asyncio.gather(*(self.batcher.submit(job) for job in jobs))
        for job in jobs:
            self.admission.account(admitted, job)
        tracing.record(admitted, jobs[-1], request.request_id)  # the last one's queue/compute
        return dest.finish(timings[-1])

    async def tokenize(self, name: str, version: int, text: str,
                       allow_special: bool) -> tuple[LoadedModel, list[int]]:
        """Text → ids with the model's tokenizer (the Tokenize RPC), after the size check."""
        model = self.repo.get(name, version)
        check_text(text, self.limits, "text")
        ids, _ = await self.admission.encode(model, text, allow_special)
        return model, ids

    def detokenize(self, name: str, version: int, ids: Any) -> tuple[LoadedModel, str]:
        """Ids → text (invalid UTF-8 becomes U+FFFD), every id checked against the vocab."""
        model = self.repo.get(name, version)
        array = np.array(ids, dtype=np.int64)
        check_ids(array, model, "token_ids")
        return model, model.tokenizer.decode(array.tolist())

    async def read(self, options: Options, inputs: Sequence[Input]) -> Admitted:
        """A request admitted as ``embed`` would admit it, without a lookup (the page's
        view of its sequences: ids after truncation, the model's facts)."""
        admitted = await self.admission.admit(options, inputs)
        self.batcher.check_room(admitted.tokens)
        return admitted
