"""The benchmark's parts on their own: reference replies, statistics and target verdicts."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

from bench.ceiling_server import CeilingPayloads
from bench.config import BenchConfig, Cell, parse_args
from bench.loadgen import protocol_for
from bench.naive_proto import NaiveResponse
from bench.naive_server import NaiveEmbedder
from bench.report import build_report, format_report, summarize
from bench.run import _requests
from bench.window import Measurement
from genproto.embedding.v1 import embedding_pb2 as pb


def test_naive_reply_is_token_plus_position_as_floats() -> None:
    token_table = torch.arange(30, dtype=torch.float32).reshape(10, 3)  # (vocab, C)
    position_table = torch.full((5, 3), 0.5)  # (max_seq_len, C)
    request = pb.EmbedRequest(token_ids=pb.TokenIds(ids=[7, 2]), start_position=1)
    reply: Any = NaiveResponse.FromString(NaiveEmbedder(token_table, position_table).reply(request))
    assert list(reply.shape) == [2, 3]
    assert list(reply.values) == [21.5, 22.5, 23.5, 6.5, 7.5, 8.5]
    decoded = protocol_for("naive").decode(reply)
    assert decoded.dtype == np.float32
    assert decoded.shape == (2, 3)


@pytest.mark.parametrize(("dtype", "nbytes", "np_dtype"), [
    (pb.DTYPE_FLOAT32, 4 * 8 * 4, np.float32),
    (pb.DTYPE_BFLOAT16, 4 * 8 * 2, np.uint16),
])
def test_ceiling_reply_is_a_full_embed_response(dtype: int, nbytes: int,
                                                np_dtype: type) -> None:
    payloads = CeilingPayloads(dim=8)
    request = pb.EmbedRequest(token_ids=pb.TokenIds(ids=[1, 2, 3, 4]), dtype=dtype)  # type: ignore[arg-type]
    raw = payloads.reply(request)
    assert payloads.reply(request) is raw  # precomputed once
    resp = pb.EmbedResponse.FromString(raw)
    assert list(resp.embeddings.shape) == [4, 8]
    assert resp.embeddings.dtype == dtype
    assert len(resp.embeddings.data) == nbytes
    assert list(resp.token_ids) == [0, 1, 2, 3]
    decoded = protocol_for("ceiling").decode(resp)
    assert decoded.shape == (4, 8)
    assert decoded.dtype == np_dtype


def test_summary_counts_payload_and_percentiles() -> None:
    m = Measurement(requests=4, seconds=2.0, latencies_ns=(4_000_000, 1_000_000, 3_000_000,
                                                          2_000_000))
    s = summarize(m, Cell("service", "unary", 16, "bfloat16", 1), dim=768)
    assert s["req_s"] == 2.0
    assert s["tokens_s"] == 32.0
    assert s["mb_s"] == 2.0 * 16 * 768 * 2 / 1e6
    assert s["p50_ms"] == 3.0  # nearest rank of (1, 2, 3, 4) ms at q=0.5 rounds to index 2
    assert s["p99_ms"] == 4.0
    naive = summarize(m, Cell("naive", "unary", 16, "bfloat16", 1), dim=768)
    assert naive["mb_s"] == 2.0 * 16 * 768 * 4 / 1e6  # repeated float is always 4 bytes


def _m(requests: int, p50_ms: float = 1.0) -> list[Measurement]:
    return [Measurement(requests, 1.0, (int(p50_ms * 1e6),) * max(requests, 1))]


def test_ratios_are_per_repetition_medians_and_targets_judge_them() -> None:
    cfg = BenchConfig(ts=(16, 1024), dtypes=("float32", "bfloat16"), concurrencies=(1, 16),
                      reps=3, modes=("unary", "stream"))
    results: dict[Cell, list[Measurement]] = {cell: [] for cell in cfg.cells()}
    per_rep = {  # (service, ceiling) req/s per repetition at T=1024 fp32 c=16 unary
        0: (60, 100), 1: (70, 50), 2: (200, 80)}
    for rep in range(3):
        for cell in results:
            if cell.T == 1024 and cell.concurrency == 16 and cell.mode == "unary":
                svc, ceil = per_rep[rep]
                n = {"service": svc, "ceiling": ceil, "naive": 10}[cell.backend]
                if cell.backend == "service" and cell.dtype == "bfloat16":
                    n = 2 * svc
                results[cell].extend(_m(n))
            elif cell.T == 16 and cell.concurrency == 1 and cell.mode == "unary":
                results[cell].extend(_m(100, p50_ms=1.2 if cell.backend == "service" else 1.0))
            else:
                results[cell].extend(_m(100 if cell.mode == "unary" else 250))
    report = build_report(cfg, results, {"reps": 3})
    targets = {t["name"]: t for t in report["targets"]}
    ceiling = targets["T=1024 fp32 c=16 unary: service/ceiling throughput"]
    # Per-repetition ratios 0.6, 1.4, 2.5: the median is 1.4, not the ratio of the medians
    # (70 / 80 = 0.875).
    assert ceiling["value"] == pytest.approx(1.4)
    assert ceiling["met"] is True
    naive = targets["T=1024 fp32 c=16 unary: service/naive throughput"]
    assert naive["value"] == pytest.approx(7.0)  # 6, 7, 20
    assert naive["met"] is False
    latency = targets["T=16 fp32 c=1 unary: service p50 / ceiling p50"]
    assert latency["value"] == pytest.approx(1.2)
    assert latency["met"] is True
    assert targets["T=16 fp32 c=16: EmbedStream / unary throughput"]["value"] == 2.5
    assert targets["T=1024 c=16 unary: bf16 / fp32 tokens/s"]["value"] == pytest.approx(2.0)
    text = format_report(report)
    assert "[NOT MET] T=1024 fp32 c=16 unary: service/naive throughput = 7.00" in text
    assert text.count("[MET    ]") == 5


def test_oip_and_shm_targets_compare_with_native_unary_and_the_unary_ceiling() -> None:
    cfg = BenchConfig(ts=(1024,), dtypes=("float32", "bfloat16"), concurrencies=(16,),
                      reps=1, modes=("unary", "oip", "shm"), backends=("ceiling", "service"))
    rates = {("ceiling", "unary", "float32"): 100, ("ceiling", "unary", "bfloat16"): 180,
             ("service", "unary", "float32"): 70, ("service", "unary", "bfloat16"): 90,
             ("service", "oip", "float32"): 63, ("service", "oip", "bfloat16"): 80,
             ("service", "shm", "float32"): 350, ("service", "shm", "bfloat16"): 490}
    results = {cell: _m(rates[(cell.backend, cell.mode, cell.dtype)]) for cell in cfg.cells()}
    assert {c.mode for c in results if c.backend == "ceiling"} == {"unary"}  # service-only
    report = build_report(cfg, results, {"reps": 1})
    targets = {t["name"]: (round(t["value"], 3), t["met"]) for t in report["targets"]}
    assert targets["T=1024 fp32 c=16: OIP ModelInfer / native unary throughput"] == (0.9, True)
    assert targets["T=1024 fp32 c=16: shm tokens/s / gRPC ceiling tokens/s"] == (3.5, True)
    assert targets["T=1024 c=16 shm: bf16 / fp32 tokens/s"] == (1.4, False)
    comps = {c["key"]: c for c in report["comparisons"]}
    assert comps["service/shm/T1024/float32/c16"]["service_over_ceiling"] == 3.5


def test_text_ids_are_windows_of_the_corpus_and_uniform_ids_span_the_vocabulary() -> None:
    corpus = list(range(1000, 1100))  # stands in for the tokenized corpus
    cell = Cell("service", "unary", 16, "bfloat16", 1)
    text = _requests(cell, random.Random(0), corpus)
    assert len(text) == 8
    for request in text:
        ids = list(request.token_ids.ids)
        assert ids == corpus[ids[0] - 1000: ids[0] - 1000 + 16]  # consecutive: a window
        assert request.dtype == pb.DTYPE_BFLOAT16
        assert request.model == "bench"
    uniform = _requests(cell, random.Random(0), None)
    assert all(0 <= i < 50257 for r in uniform for i in r.token_ids.ids)
    assert parse_args(["--ids", "text"]).ids == "text"
    assert parse_args([]).ids == "uniform"
