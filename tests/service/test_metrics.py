"""The event-loop metrics export exactly what prometheus_client's own types would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from service.metrics import LoopCounter, LoopHistogram


def _without_created(text: bytes) -> str:
    # prometheus_client adds *_created series to its own types; ours carry none.
    return "\n".join(line for line in text.decode().splitlines() if "_created" not in line)


def test_loop_histogram_matches_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    h = LoopHistogram("x_seconds", "Doc.", ["rpc"], (0.001, 0.01, 1.0), ours)
    ref = Histogram("x_seconds", "Doc.", ["rpc"], buckets=(0.001, 0.01, 1.0), registry=theirs)
    for value in (0.0005, 0.001, 0.002, 0.5, 7.0):  # 0.001 lands in le="0.001" (inclusive)
        h.labels("Embed").observe(value)
        ref.labels("Embed").observe(value)
    assert _without_created(generate_latest(ours)) == _without_created(generate_latest(theirs))
    text = generate_latest(ours).decode()
    assert 'x_seconds_bucket{le="0.001",rpc="Embed"} 2.0' in text
    assert 'x_seconds_bucket{le="+Inf",rpc="Embed"} 5.0' in text
    assert 'x_seconds_count{rpc="Embed"} 5.0' in text


def test_loop_counter_matches_prometheus_client_and_unlabelled_starts_at_zero() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    c = LoopCounter("y", "Doc.", ["model", "code"], ours)
    ref = Counter("y", "Doc.", ["model", "code"], registry=theirs)
    c.labels("m", "OK").inc(3)
    ref.labels("m", "OK").inc(3)
    assert _without_created(generate_latest(ours)) == _without_created(generate_latest(theirs))
    lone = CollectorRegistry()
    LoopHistogram("z", "Doc.", [], (1.0,), lone)
    assert 'z_count 0.0' in generate_latest(lone).decode()
