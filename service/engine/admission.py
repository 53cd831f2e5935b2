"""Admission: one pass from a request's fields to a validated, tokenized batch of sequences.

Every front turns its message into ``Options`` and a list of ``Input`` (the engine's
vocabulary); ``Engine.embed`` hands them to ``Admission.admit``, and what comes back is an
``Admitted`` request (model, sequences after truncation, their ids as one tensor) or one
typed error from ``service.errors``. Text becomes ids in one place, ``Admission.encode``,
with its metric, for embeddings and the Tokenize RPC alike. Checks run in the order a
client would fix them: model, enums, compose and output dtype, then the request's whole
size from what it declares (number of inputs, each text's bytes and their sum, the token
ids' count), all before any per-input work, tokenization or allocation; then each input
(tokenize, id range, length), then the totals after truncation (tokens, output and
response bytes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, overload

import numpy as np

from genproto.embedding.v1 import embedding_pb2 as pb
from service.dtypes import BY_WIRE
from service.engine.batcher import Destination, Job
from service.engine.loading import LoadedModel
from service.engine.repository import Repository
from service.engine.validation import (
    Limits,
    TokenSequence,
    check_compose,
    check_dtype_range,
    check_ids,
    check_input_count,
    check_options,
    check_output_bytes,
    check_response_size,
    check_text,
    check_text_total,
    fit_length,
    text_bytes,
)
from service.errors import InvalidArgument
from service.metrics import Metrics

__all__ = ["Admission", "Admitted", "Input", "Inputs", "Options"]

_SMALL = 64  # ids of a sequence up to which np.fromiter is the cheaper copy


class Options:
    """Request-wide settings, as proto enum numbers (each front maps its own names).

    Plain classes with slots here and below (not dataclasses): one of each is built per
    request, and a frozen dataclass's ``__init__`` costs microseconds of it."""

    __slots__ = ("add_special_tokens", "allow_special_tokens", "compose", "dtype",
                 "in_message", "model", "truncate", "version")

    def __init__(self, model: str = "", version: int = 0,
                 compose: int = pb.COMPOSE_TOKEN_PLUS_POSITION, dtype: int = pb.DTYPE_FLOAT32,
                 truncate: int = pb.TRUNCATE_NONE, allow_special_tokens: bool = False,
                 add_special_tokens: bool | None = None, in_message: bool = True) -> None:
        self.model = model  # "" = the default model
        self.version = version  # 0 = the newest loaded version
        self.compose = compose
        self.dtype = dtype
        self.truncate = truncate
        self.allow_special_tokens = allow_special_tokens
        # None: the model's default (AutoTokenizer's: e.g. Llama's BOS); True/False override.
        self.add_special_tokens = add_special_tokens
        # The rows travel in the response message (bound by max_message_bytes); False when
        # they go to shared memory, which is bound by the region instead.
        self.in_message = in_message


class Input:
    """One sequence as a front received it: text or ids, and the field that held it."""

    __slots__ = ("field", "ids", "start_position", "text", "value_field")

    def __init__(self, field: str, text: str | None = None, ids: Any = None,
                 start_position: int = 0, value_field: str | None = None) -> None:
        self.field = field  # named in error messages: "input", "inputs[3]", "input_ids[1]"
        self.text = text
        self.ids = ids  # int64-convertible: a proto repeated field, a list, a numpy array
        self.start_position = start_position
        # The value's own field name when it is not the native ``<field>.text`` or
        # ``<field>.token_ids.ids`` (the OIP face names its tensors).
        self.value_field = value_field


class Inputs(Sequence[Input]):
    """A request's inputs, counted before they are built: ``len`` is the declared count
    (``len()`` of a repeated field, or B of a shape), and ``build`` runs only when an input
    is first read, i.e. after admission has checked that count against its limit. A
    request declaring 100k inputs is refused without one Python step per input."""

    def __init__(self, count: int, build: Callable[[], Sequence[Input]]) -> None:
        self._count = count
        self._build: Callable[[], Sequence[Input]] | None = build
        self._items: Sequence[Input] = ()

    def __len__(self) -> int:
        return self._count

    def _built(self) -> Sequence[Input]:
        if self._build is not None:
            self._items, self._build = self._build(), None
            if len(self._items) != self._count:
                raise InvalidArgument(f"inputs: {self._count} declared, "
                                      f"{len(self._items)} given")
        return self._items

    @overload
    def __getitem__(self, index: int) -> Input: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Input]: ...
    def __getitem__(self, index: int | slice) -> Input | Sequence[Input]:
        return self._built()[index]

    def __iter__(self) -> Iterator[Input]:
        return iter(self._built())


class Admitted:
    """A validated request: its model, sequences after truncation, and their ids."""

    __slots__ = ("dim", "itemsize", "lengths", "model", "options", "sequences", "tokenize_ns",
                 "tokens")

    def __init__(self, model: LoadedModel, options: Options, sequences: list[TokenSequence],
                 tokenize_ns: int) -> None:
        self.model = model
        self.options = options
        self.sequences = sequences
        self.tokenize_ns = tokenize_ns
        self.lengths = [f.ids.shape[0] for f in sequences]  # T of each sequence
        self.tokens = sum(self.lengths)  # rows in all: ΣT
        # Columns of each row for the request's compose (token-only: the table's width),
        # and bytes per element of the output dtype.
        self.dim = model.tables.out_dim(options.compose)
        self.itemsize = BY_WIRE[options.dtype].itemsize

    @property
    def ids(self) -> np.ndarray:
        """Every sequence's ids, concatenated (N,)."""
        seqs = self.sequences
        return seqs[0].ids if len(seqs) == 1 else np.concatenate([f.ids for f in seqs])

    def job(self, dest: Destination, start_ns: int, deadline: float | None,
            sequences: Sequence[TokenSequence] | None = None) -> Job:
        """The batcher job writing ``sequences`` (default: all, packed) into ``dest``."""
        if sequences is None:
            ids, lengths, seqs = self.ids, self.lengths, self.sequences  # (N,)
        else:
            seqs = list(sequences)
            ids = seqs[0].ids if len(seqs) == 1 else np.concatenate([f.ids for f in seqs])
            lengths = [f.ids.shape[0] for f in seqs]
        spans = [(f.start_position, n) for f, n in zip(seqs, lengths)]
        return Job(self.model.tables, ids, spans, self.options.compose, dest, start_ns,
                   self.tokenize_ns, deadline)


class Admission:
    """Validates and tokenizes requests for every front, against one repository."""

    def __init__(self, repo: Repository, limits: Limits, tokenize_pool: ThreadPoolExecutor,
                 metrics: Metrics) -> None:
        self.repo = repo
        self.limits = limits
        self._pool = tokenize_pool
        self._metrics = metrics

    async def admit(self, options: Options, inputs: Sequence[Input]) -> Admitted:
        """Validate ``options`` and every input; tokenize text; apply length limits."""
        model = self.repo.get(options.model, options.version)
        check_options(options.compose, options.dtype, options.truncate)
        check_compose(options.compose, model)
        check_dtype_range(options.compose, options.dtype, model)
        if not inputs:
            raise InvalidArgument("inputs is empty: give at least one input")
        texts = self.check_size(options, inputs)
        if not texts:  # ids only: checked inline, nothing to wait for
            tokenized = [(self._ids(model, inp), 0) for inp in inputs]
        elif len(texts) == 1:  # one text needs no gather
            tokenized = [await self._tokens(model, inp, options) for inp in inputs]
        else:  # texts tokenize in parallel on the pool
            encoded = await asyncio.gather(*(
                self._tokens(model, inputs[i], options) for i in texts))
            by_index = dict(zip(texts, encoded))
            tokenized = [by_index[i] if i in by_index
                         else await self._tokens(model, inp, options)
                         for i, inp in enumerate(inputs)]
        limits = self.limits
        sequences = [fit_length(ids, inp.start_position, options.truncate, model, limits,
                                inp.field) for (ids, _), inp in zip(tokenized, inputs)]
        admitted = Admitted(model, options, sequences,
                            tokenized[0][1] if len(tokenized) == 1
                            else sum(ns for _, ns in tokenized))
        total = admitted.tokens
        if len(inputs) > 1 and total > limits.max_tokens_per_request:
            raise InvalidArgument(f"inputs have {total} tokens in all; max_tokens_per_request "
                                  f"is {limits.max_tokens_per_request}")
        check_output_bytes(total, model, admitted.itemsize, BY_WIRE[options.dtype].name,
                           limits, admitted.dim)
        if options.in_message:
            check_response_size(total, model, admitted.itemsize, limits, admitted.dim)
        return admitted

    def check_size(self, options: Options, inputs: Sequence[Input]) -> list[int]:
        """The request's whole size from what it declares, before any per-input work:
        the number of inputs (from ``len``), each text's bytes and their sum, and with
        TRUNCATE_NONE the token ids' count (every id is kept or the request refused).
        Returns the indices of the inputs that are text."""
        limits = self.limits
        check_input_count(len(inputs), limits)
        total_text = 0
        texts = []
        for i, inp in enumerate(inputs):  # at most max_inputs_per_request
            if inp.text is not None:
                check_text(inp.text, limits, inp.value_field or f"{inp.field}.text")
                total_text += text_bytes(inp.text)
                check_text_total(total_text, limits)  # stop at the first input past it
                texts.append(i)
        if options.truncate != pb.TRUNCATE_NONE:
            return texts  # the ids kept are known after fitting; checked then
        declared = sum(len(inp.ids) for inp in inputs if inp.ids is not None)
        cap = limits.max_tokens_per_request
        if declared > cap:
            if len(inputs) == 1:  # the same words fit_length uses for one sequence
                raise InvalidArgument(f"{inputs[0].field} has T={declared} tokens; "
                                      f"max_tokens_per_request is {cap} (or set truncate)")
            raise InvalidArgument(f"inputs have {declared} tokens in all; "
                                  f"max_tokens_per_request is {cap}")
        return texts

    async def encode(self, model: LoadedModel, text: str, allow_special: bool,
                     add_special: bool | None = None) -> tuple[list[int], int]:
        """Text → ids on the tokenizer pool (its size already checked), and the
        nanoseconds it took (observed as ``embed_tokenize_duration_seconds``)."""
        tokenizer = model.tokenizer  # FAILED_PRECONDITION for an ids-only model
        t0 = time.perf_counter_ns()
        ids: list[int] = await asyncio.get_running_loop().run_in_executor(
            self._pool, tokenizer.encode, text, allow_special, add_special)
        ns = time.perf_counter_ns() - t0
        if self._metrics.counting:
            self._metrics.tokenize_duration.observe(ns / 1e9)
        return ids, ns

    async def _tokens(self, model: LoadedModel, inp: Input,
                      options: Options) -> tuple[np.ndarray, int]:
        """The input's ids (int64, in range) and the nanoseconds spent tokenizing."""
        if inp.text is not None:  # its size was checked with the request's (check_size)
            ids, ns = await self.encode(model, inp.text, options.allow_special_tokens,
                                        options.add_special_tokens)
            return np.asarray(ids, dtype=np.int64), ns
        return self._ids(model, inp), 0

    @staticmethod
    def _ids(model: LoadedModel, inp: Input) -> np.ndarray:
        """An ids input's ids (int64, each in the model's vocabulary)."""
        if inp.ids is None:
            raise InvalidArgument(f"{inp.field} is empty: set text or token_ids")
        raw = inp.ids
        if isinstance(raw, np.ndarray):
            ids = raw.astype(np.int64, copy=False)
        elif len(raw) <= _SMALL:  # iterating a few beats the buffer protocol's set-up
            ids = np.fromiter(raw, np.int64, len(raw))
        else:
            ids = np.array(raw, dtype=np.int64)  # buffer protocol: ~15x fromiter
        check_ids(ids, model, inp.value_field or f"{inp.field}.token_ids.ids")
        return ids

    def untrained(self, model: LoadedModel, ids: np.ndarray) -> list[int]:
        """Indices i < T whose token row was never updated in training (counted)."""
        if model.untrained is None:
            return []
        # a numpy view of the host flags: a third of torch's indexing and nonzero
        idx = np.flatnonzero(model.untrained.numpy()[ids]).tolist()  # indices i < T
        if idx and self._metrics.counting:
            self._metrics.untrained_lookups.labels(model.name).inc(len(idx))
        return idx

    def untrained_per_sequence(self, admitted: Admitted) -> list[list[int]]:
        """``untrained`` for each sequence, from one lookup over all of them."""
        B = len(admitted.sequences)
        if admitted.model.untrained is None:
            return [[] for _ in range(B)]
        flat = self.untrained(admitted.model, admitted.ids)  # indices into the N rows
        out: list[list[int]] = [[] for _ in range(B)]
        if flat:
            starts = np.cumsum([0, *admitted.lengths[:-1]])
            owner = np.searchsorted(starts, flat, side="right") - 1  # sequence of each row
            for row, b in zip(flat, owner.tolist()):
                out[b].append(row - int(starts[b]))
        return out

    def account(self, admitted: Admitted, job: Job) -> None:
        """Record a finished job's tokens, bytes and queue time (on the event loop)."""
        if not self._metrics.counting:
            return
        self._metrics.rows_returned(admitted.model.name, BY_WIRE[admitted.options.dtype].name,
                                    job.tokens, job.tokens * admitted.dim * admitted.itemsize,
                                    job.queue_ns / 1e9)

