"""Dynamic batching: concurrent requests from every RPC share one trip to the tables.

Requests queue as ``Job``s. One loop task takes what is queued (optionally waiting
``max_batch_delay_us`` for more), up to ``max_batch_tokens``, drops jobs whose deadline
passed or whose caller went away, and runs the batch on the compute thread: per group of
(model, compose, dtype), one ``embed_into`` writes every job's rows into its destination,
and each destination is finished with the job's timing.

The batcher knows no message type. A job carries a ``Destination``: a writable [N, C]
view (the native response bytes, the OIP response bytes, a shared-memory region) and a
``finish`` that completes whatever holds it. What ``finish`` returns is what ``submit``
returns, so every front shares this one batcher and its batches.
Lookups are elementwise, so a job's rows are bit-identical however it was batched.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from service.engine.tables import EmbeddingTables, Span
from service.errors import DeadlineExceeded, ResourceExhausted

__all__ = ["INLINE_TOKENS", "Batcher", "Destination", "Job", "Timing"]

# Batches up to this many rows run on the event loop: a 256-row gather+add+copy takes tens
# of µs at C=768, less than handing it to the compute thread and waking the loop back up.
INLINE_TOKENS = 256


class Timing(NamedTuple):
    """Where a job's time went, in nanoseconds."""

    queue_ns: int  # submit → its batch started
    tokenize_ns: int
    compute_ns: int  # its group's lookup, up to finish
    total_ns: int  # the RPC's start → finish


class Destination(Protocol):
    """Where a job's rows go: ``rows`` is written by the lookup, then ``finish`` is called
    once on the compute thread; its return value is the job's result.

    A destination may also have ``lookup(tables, ids, spans, compose) -> bool``: it then
    writes its own rows where it can (a shared-memory region's mapping, through the
    guarded one-pass kernel) and returns True, or False to be given ``rows`` as usual.
    A destination may name its ``dtype`` so that grouping never touches ``rows``."""

    @property
    def rows(self) -> torch.Tensor:
        """(N, C), writable, in the output dtype."""

    def finish(self, timing: Timing) -> Any:
        """Complete the output (e.g. write the timing fields) and return the result."""


class Job:
    """One request's lookup: rows for ids at the spans' positions, written into ``dest``.
    (A plain class with slots: one is built per request.)"""

    __slots__ = ("batch_requests", "batch_tokens", "compose", "deadline", "dest",
                 "enqueued_ns", "future", "ids", "queue_ns", "spans", "start_ns", "tables",
                 "timing", "tokenize_ns", "tokens")

    def __init__(self, tables: EmbeddingTables, ids: np.ndarray, spans: list[Span],
                 compose: int, dest: Destination, start_ns: int, tokenize_ns: int = 0,
                 deadline: float | None = None) -> None:
        self.tables = tables
        self.ids = ids  # (N,) int64, validated
        self.spans = spans  # (start_position, T) per sequence, summing to N rows
        self.compose = compose
        self.dest = dest  # its rows are [N, C] in the output dtype
        self.start_ns = start_ns  # perf_counter_ns() when the RPC began: total_ns from here
        self.tokenize_ns = tokenize_ns
        self.deadline = deadline  # time.monotonic() seconds; None = no deadline
        self.tokens: int = ids.shape[0]  # rows this job needs
        self.future: asyncio.Future[Any] | None = None  # set when it is queued
        self.enqueued_ns = 0
        # Set when the job's batch runs (for metrics and tests).
        self.queue_ns = 0  # submit → batch start
        self.batch_tokens = 0
        self.batch_requests = 0
        self.timing: Timing | None = None  # set at finish (for tracing)


class Batcher:
    """Token-budgeted dynamic batcher with a bounded queue; one compute thread."""

    def __init__(self, max_batch_tokens: int, max_batch_delay_us: int, max_queue_tokens: int,
                 on_batch: Callable[[int, int, float, str], None] | None = None) -> None:
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_delay_s = max_batch_delay_us / 1e6
        self.max_queue_tokens = max_queue_tokens
        self._on_batch = on_batch  # (tokens, requests, seconds, device) for metrics
        self._queue: deque[Job] = deque()
        self.queued_tokens = 0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._busy = False  # a batch is on the compute thread
        # One thread: torch ops release the GIL, and a single thread keeps the reused
        # output buffers race-free and batches in submission order.
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="embed-compute")

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="batcher")

    async def close(self) -> None:
        """Stop the loop and cancel the jobs still queued."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for job in self._queue:
            if job.future is not None and not job.future.done():
                job.future.cancel()
        self._queue.clear()
        self._compute.shutdown(wait=True)

    def check_room(self, tokens: int) -> None:
        """RESOURCE_EXHAUSTED now if ``tokens`` more would overflow the queue budget: fronts
        call this before they allocate a response, so a refusal costs next to nothing."""
        if self.queued_tokens + tokens > self.max_queue_tokens:
            raise ResourceExhausted(
                f"queue holds {self.queued_tokens} tokens; this request's {tokens} would "
                f"exceed max_queue_tokens={self.max_queue_tokens}; retry later")

    async def submit(self, job: Job) -> Any:
        """Queue a job and wait for what its destination's ``finish`` returns."""
        self.check_room(job.tokens)
        if job.deadline is not None and time.monotonic() >= job.deadline:
            raise DeadlineExceeded("deadline passed before compute; no work was done")
        job.enqueued_ns = time.perf_counter_ns()
        if (not self._queue and not self._busy and self.max_batch_delay_s == 0
                and job.tokens <= INLINE_TOKENS):
            # Idle and nothing to wait for: this job is the whole batch. Computing it here
            # skips two hops through the event loop (wake the batcher, wake us back).
            return self._inline(job)
        future = job.future = asyncio.get_running_loop().create_future()
        self._queue.append(job)
        self.queued_tokens += job.tokens
        assert self._wakeup is not None, "Batcher.start() was not called"
        self._wakeup.set()
        return await future

    def _inline(self, job: Job) -> Any:
        """One job as a batch of its own, on the loop: ``_compute_batch`` without the
        grouping a batch of one does not need."""
        start_ns = time.perf_counter_ns()
        job.batch_tokens, job.batch_requests = job.tokens, 1
        dest = job.dest
        result: Any
        try:
            lookup = getattr(dest, "lookup", None)
            if lookup is None or not lookup(job.tables, job.ids, job.spans, job.compose):
                job.tables.embed_into([(job.ids, job.spans, dest.rows)], job.compose)
            result = self._finish(job, start_ns, start_ns)
        except Exception as e:  # its own failure (a region that shrank): counted, then raised
            result = e
        if self._on_batch is not None:
            self._on_batch(job.tokens, 1, (time.perf_counter_ns() - start_ns) / 1e9,
                           job.tables.device_type)
        if isinstance(result, BaseException):
            raise result
        return result

    def _take(self) -> list[Job]:
        batch: list[Job] = []
        tokens = 0
        now = time.monotonic()
        while self._queue:
            job = self._queue[0]
            # A job larger than the budget still runs, alone: requests are bounded elsewhere.
            if batch and tokens + job.tokens > self.max_batch_tokens:
                break
            self._queue.popleft()
            self.queued_tokens -= job.tokens
            assert job.future is not None  # queued jobs have one
            if job.future.done():  # the caller cancelled (client went away)
                continue
            if job.deadline is not None and now >= job.deadline:
                job.future.set_exception(
                    DeadlineExceeded("deadline passed while queued; no work was done"))
                continue
            batch.append(job)
            tokens += job.tokens
        return batch

    async def _run(self) -> None:
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            if self.max_batch_delay_s > 0 and self.queued_tokens < self.max_batch_tokens:
                await asyncio.sleep(self.max_batch_delay_s)
            batch = self._take()
            if not batch:
                continue
            try:
                if sum(job.tokens for job in batch) <= INLINE_TOKENS:
                    done = self._compute_batch(batch)  # cheaper than two thread wake-ups
                else:
                    self._busy = True
                    try:
                        done = await loop.run_in_executor(self._compute,
                                                          self._compute_batch, batch)
                    finally:
                        self._busy = False
                results = self._observe(batch, *done)
            except Exception as e:  # a bug, not bad input: fail this batch, keep serving
                for job in batch:
                    if job.future is not None and not job.future.done():
                        job.future.set_exception(e)
                continue
            for job, result in zip(batch, results):
                future = job.future
                if future is None or future.done():
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

    def _observe(self, batch: list[Job], results: list[Any], seconds: float) -> list[Any]:
        """Report the batch to the metrics hook (on the event loop, never the compute
        thread) and pass its results through."""
        if self._on_batch is not None:
            self._on_batch(batch[0].batch_tokens, len(batch), seconds,
                           batch[0].tables.device_type)
        return results

    def _compute_batch(self, batch: list[Job]) -> tuple[list[Any], float]:
        """Every job's result (or its error), and the batch's seconds."""
        start_ns = time.perf_counter_ns()
        groups: dict[tuple[int, int, torch.dtype], list[int]] = {}
        for i, job in enumerate(batch):
            dtype = getattr(job.dest, "dtype", None) or job.dest.rows.dtype
            groups.setdefault((id(job.tables), job.compose, dtype), []).append(i)
        results: list[Any] = [None] * len(batch)
        total = sum(job.tokens for job in batch)
        for job in batch:
            job.batch_tokens, job.batch_requests = total, len(batch)
        for group in groups.values():
            t0 = time.perf_counter_ns()
            members = self._lookup_own(batch, group, results, start_ns, t0)
            if not members:
                continue
            jobs = [batch[i] for i in members]
            try:
                jobs[0].tables.embed_into([(job.ids, job.spans, job.dest.rows) for job in jobs],
                                          jobs[0].compose)
                for i, job in zip(members, jobs):
                    try:  # a destination that cannot take its rows fails its own job only
                        results[i] = self._finish(job, start_ns, t0)
                    except Exception as e:
                        results[i] = e
            except Exception as e:  # one failed group must not fail its batch-mates
                for i in members:
                    results[i] = e
        return results, (time.perf_counter_ns() - start_ns) / 1e9

    def _lookup_own(self, batch: list[Job], members: list[int], results: list[Any],
                    start_ns: int, t0: int) -> list[int]:
        """Jobs whose destination writes its own rows (``Destination.lookup``) are looked
        up and finished one by one, each failure its own; the rest are returned."""
        rest = []
        for i in members:
            job = batch[i]
            lookup = getattr(job.dest, "lookup", None)
            if lookup is None:
                rest.append(i)
                continue
            try:
                if not lookup(job.tables, job.ids, job.spans, job.compose):
                    rest.append(i)
                    continue
                results[i] = self._finish(job, start_ns, t0)
            except Exception as e:
                results[i] = e
        return rest

    @staticmethod
    def _finish(job: Job, start_ns: int, t0: int) -> Any:
        """Finish the destination: queue is submit → batch start, compute runs from ``t0``
        (just before the group's lookup)."""
        now = time.perf_counter_ns()
        job.queue_ns = start_ns - job.enqueued_ns
        # Kept on the job so the event loop can lay out the request's trace spans later;
        # this thread never touches tracing.
        job.timing = Timing(job.queue_ns, job.tokenize_ns, now - t0, now - job.start_ns)
        return job.dest.finish(job.timing)
