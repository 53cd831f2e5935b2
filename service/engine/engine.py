"""The engine: one object every front holds, from admitted request to rows in a destination.

``server.py`` builds it once (repository, admitter, batcher, shared-memory registry,
limits, draining state) and hands it to each front. A front only translates its wire
format into ``Options`` + ``Input``s and a destination for the rows, then calls
``admit`` and ``run``; everything after that (the room check, the batch, the metrics of
the work, tracing) is here, written once for every front.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from service import tracing
from service.dtypes import BY_WIRE
from service.engine.admission import Admission, Admitter, Input, Options
from service.engine.batcher import Batcher, Destination, Timing
from service.engine.repository import LoadedModel, Repository
from service.engine.shm import Caller, SharedMemoryRegistry
from service.engine.shm_plan import ShmPlan
from service.engine.validation import Limits, check_text
from service.metrics import Metrics

__all__ = ["Engine", "RowSlice"]


class RowSlice:
    """Rows of one sequence inside a larger output (a padded [B, T, C] tensor), as a
    destination of their own; ``finish`` returns the timing."""

    __slots__ = ("rows",)

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows  # (T, C) view of the whole output

    def finish(self, timing: Timing) -> Timing:
        """Nothing to complete: the owner of the whole output finishes it."""
        del self.rows
        return timing


class Engine:
    """Admission, batching and shared memory, shared by the native, OIP and HTTP fronts."""

    def __init__(self, repo: Repository, batcher: Batcher, metrics: Metrics, limits: Limits,
                 tokenize_pool: ThreadPoolExecutor,
                 shm: SharedMemoryRegistry | None = None) -> None:
        self.repo = repo
        self.batcher = batcher
        self.metrics = metrics
        self.limits = limits
        self.shm = shm if shm is not None else SharedMemoryRegistry()
        self.admitter = Admitter(repo, limits, tokenize_pool, metrics)
        self._pool = tokenize_pool
        self.draining = False  # set once on SIGTERM: every front refuses new work

    @property
    def ready(self) -> bool:
        """A model is loaded and the server is not draining."""
        return bool(self.repo.models) and not self.draining

    def model(self, name: str, version: int = 0) -> LoadedModel:
        """A loaded model version ("" = default, 0 = newest), or NOT_FOUND/UNAVAILABLE."""
        return self.repo.get(name, version)

    async def admit(self, options: Options, inputs: Sequence[Input]) -> Admission:
        """Validate and tokenize, then check there is room in the queue (before any
        output is allocated, so an over-budget request costs nothing more)."""
        admission = await self.admitter.admit(options, inputs)
        self.batcher.check_room(admission.tokens)
        return admission

    async def tokenize(self, model: LoadedModel, text: str, allow_special: bool,
                       field: str = "text") -> list[int]:
        """Text → ids on the tokenizer pool, after the text-size check."""
        check_text(text, self.limits, field)
        ids: list[int] = await asyncio.get_running_loop().run_in_executor(
            self._pool, model.tokenizer.encode, text, allow_special)
        return ids

    def plan_shm(self, caller: Caller, region: str, offset: int, shape: tuple[int, ...],
                 dtype: int, field: str, byte_size: int | None = None) -> ShmPlan:
        """Rows of ``shape`` in the output ``dtype`` (wire enum) for one of the caller's
        regions, bounds-checked now (against the region and the request's ``byte_size``)."""
        return self.shm.plan(caller, region, offset, shape, BY_WIRE[dtype].torch, field,
                             byte_size)

    async def run(self, admission: Admission, dest: Destination, start_ns: int,
                  deadline: float | None, request_id: str) -> Any:
        """Every sequence, packed, into ``dest``; returns what ``dest.finish`` returns."""
        job = admission.job(dest, start_ns, deadline)
        result = await self.batcher.submit(job)
        tracing.record(admission, job, request_id)  # tracing: spans from job.timing
        self.admitter.account(admission, job)
        return result

    async def run_padded(self, admission: Admission, rows: torch.Tensor, dest: Destination,
                         start_ns: int, deadline: float | None, request_id: str) -> Any:
        """Sequences of different T into ``rows`` (B, T, C), rows past each sequence's
        length zeroed: one job per sequence into its slice, then ``dest`` is finished."""
        lengths = admission.lengths
        if len(set(lengths)) == 1:
            return await self.run(admission, dest, start_ns, deadline, request_id)
        for b, n in enumerate(lengths):
            rows[b, n:].zero_()  # (T - n, C) padding
        jobs = [admission.job(RowSlice(rows[b, :n]), start_ns, deadline, [seq])
                for b, (n, seq) in enumerate(zip(lengths, admission.sequences))]
        timings = await asyncio.gather(*(self.batcher.submit(job) for job in jobs))
        for job in jobs:
            self.admitter.account(admission, job)
        tracing.record(admission, jobs[-1], request_id)  # the last sequence's queue/compute
        return dest.finish(timings[-1])

    def untrained(self, admission: Admission) -> list[list[int]]:
        """Per sequence, the indices whose token row was never updated in training."""
        return self.admitter.untrained_per_sequence(admission)

    @staticmethod
    def now_ns() -> int:
        """The clock a request's ``start_ns`` is read from."""
        return time.perf_counter_ns()
