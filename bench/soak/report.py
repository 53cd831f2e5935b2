"""The soak's report: latency and RSS over time, totals, verdicts; JSON, a PNG and a summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.harness.load import percentile
from bench.soak import slow as slowly
from service.config import parse_config

if TYPE_CHECKING:
    from bench.soak.run import Soak

__all__ = ["build_report", "format_slow", "format_summary", "latency_windows"]


def latency_windows(latencies: Sequence[tuple[float, float, str]], seconds: float,
                    window_s: float) -> list[dict[str, float]]:
    """Per window of ``window_s``: answers, p50 and p99 latency in ms (all RPCs together)."""
    n = max(1, int(seconds // window_s + (seconds % window_s > 1e-9)))
    buckets: list[list[float]] = [[] for _ in range(n)]
    for t, lat, _ in latencies:
        buckets[min(n - 1, int(t // window_s))].append(lat * 1e3)
    return [{"t": round((i + 0.5) * window_s, 2), "answers": len(b),
             "p50_ms": percentile(b, 0.5), "p99_ms": percentile(b, 0.99)}
            for i, b in enumerate(buckets)]


def build_report(run: Soak, final: list[int], exit_code: int | None) -> dict[str, Any]:
    """The soak's JSON: totals, latency and RSS over time, events, the checks and verdict."""
    args, t = run.args, run.tally
    valid = sum(n for (_, _, v), n in t.codes.items() if v)
    invalid = sum(n for (_, _, v), n in t.codes.items() if not v)
    lats = [lat * 1e3 for _, lat, _ in t.latencies]
    windows = latency_windows(t.latencies, args.minutes * 60, args.window)
    p99s = [w["p99_ms"] for w in windows if w["answers"]]
    rss = [r["total_mb"] for r in run.rss]
    log_lines = [line for line in run.server.log.read_text().splitlines()
                 if any(k in line for k in ("restart", "refused", "loaded model", "Traceback",
                                            " ERROR ", "started "))]
    pub = run.publisher
    budgets = parse_config([*args.server_arg, "--model-repository", str(run.root)])
    slow = slowly.slow_summary(
        run.slow, budgets.max_stream_buffer_bytes, budgets.max_unsent_bytes, args.slow_readers,
        args.slow_tokens * args.slow_dim * 4,
        slowly.rss_during(run.slow.stretches, run.rss, run.events),
        args.rest_slow_readers * args.rest_slow_batch * args.slow_tokens * args.slow_dim * 4)
    checks = {
        "lost": t.lost, "corrupted": t.corrupted, "wrong_code": t.wrong_code,
        "failed_valid": sum(t.failures.values()),
        "bad_versions_answered": sum(t.versions[v] for v in pub.bad),
        "bad_versions_refused": all(run.log_count(f"refused model=soak version={v}:") > 0
                                    for v in pub.bad),
        "final_version_is_last_good": all(v == pub.good[-1] for v in final),
        "killed_worker_restarted": run.killed is None
        or "serving_again" in {e["kind"] for e in run.events},
        "server_exit_code": exit_code,
        "slow_lost": slow["lost"], "slow_corrupted": slow["corrupted"],
        "slow_failed": slow["failed"], "slow_rss_within_bound": slow["within_bound"],
        "shm_scenario_passed": None if run.shm is None else run.shm.passed,
    }
    zero = ("lost", "corrupted", "wrong_code", "failed_valid", "bad_versions_answered",
            "slow_lost", "slow_corrupted", "slow_failed")
    true = ("bad_versions_refused", "final_version_is_last_good", "killed_worker_restarted")
    passed = (all(checks[k] == 0 for k in zero) and all(checks[k] for k in true)
              and exit_code == 0 and checks["slow_rss_within_bound"] is not False
              and checks["shm_scenario_passed"] is not False)
    codes = {f"{rpc} {code} {'valid' if v else 'invalid'}": n
             for (rpc, code, v), n in sorted(t.codes.items())}
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "totals": {"requests": valid + invalid, "by_rpc": dict(t.requests), "valid": valid,
                   "invalid": invalid, "answered": t.answered,
                   "failed_valid": sum(t.failures.values()),
                   "failures_by_code": dict(t.failures), "wrong_code": t.wrong_code,
                   "codes": codes, "calls": run.counter.calls,
                   "attempts": run.counter.attempts, "retries": run.counter.retries,
                   "stream_resumes": t.stream_resumes, "lost": t.lost,
                   "rest_retries": sum(c.retries for c in run.rest_clients),
                   "corrupted": t.corrupted, "versions": dict(sorted(t.versions.items()))},
        "latency": {"p50_ms": percentile(lats, 0.5), "p99_ms": percentile(lats, 0.99),
                    "window_p99_min_ms": min(p99s, default=float("nan")),
                    "window_p99_max_ms": max(p99s, default=float("nan"))},
        "latency_windows": windows, "rss": run.rss,
        "rss_summary": {"start_mb": rss[0] if rss else 0, "end_mb": rss[-1] if rss else 0,
                        "min_mb": min(rss, default=0), "max_mb": max(rss, default=0)},
        "events": run.events, "published": {"good": pub.good, "bad": pub.bad},
        "final_versions": final, "server_log": log_lines[:40],
        "problems": t.problems + run.slow.problems + (run.shm.errors if run.shm else []),
        "slow_reader": slow, "shm": None if run.shm is None else asdict(run.shm),
        "checks": checks, "passed": passed,
    }


def format_summary(report: Mapping[str, Any]) -> str:
    """The figures a person reads: totals, codes, retries, latency, RSS, events, verdict."""
    t, lat, rss = report["totals"], report["latency"], report["rss_summary"]
    lines = [
        f"requests {t['requests']} ({', '.join(f'{k} {v}' for k, v in t['by_rpc'].items())}; "
        f"{t['valid']} valid, {t['invalid']} invalid)",
        f"valid answered {t['answered']}, valid failed {t['failed_valid']} "
        f"{dict(t['failures_by_code'])}",
        f"invalid with the expected code {t['invalid'] - t['wrong_code']}, "
        f"wrong code {t['wrong_code']}",
        f"codes: {t['codes']}",
        f"retries (channelz: attempts - calls) {t['retries']}; stream resumes "
        f"{t['stream_resumes']}; REST requests sent again on a new connection "
        f"{t.get('rest_retries', 0)}",
        f"lost {t['lost']}, corrupted {t['corrupted']}",
        f"answers by version {t['versions']}",
        f"latency of valid answers: p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms; "
        f"per-window p99 {lat['window_p99_min_ms']:.1f}..{lat['window_p99_max_ms']:.1f} ms",
        f"server RSS: start {rss['start_mb']:.0f} MB, end {rss['end_mb']:.0f} MB, "
        f"min {rss['min_mb']:.0f}, max {rss['max_mb']:.0f} MB",
    ]
    if report.get("slow_reader", {}).get("stretches"):
        lines.append(format_slow(report["slow_reader"]))
    if report.get("shm"):
        s = report["shm"]
        lines.append(f"shared memory: good answers {s['good_ok']} (lost {s['lost']}, corrupted "
                     f"{s['corrupted']}); careless answers {s['careless']} over "
                     f"{s['truncations']} truncations")
    lines += [f"event t={ev['t']:.1f}s {ev['label']}" for ev in report["events"]]
    lines += [f"server: {line}" for line in report["server_log"]]
    lines += [f"problem: {p}" for p in report["problems"]]
    lines.append("verdict: " + ("PASS" if report["passed"] else "FAIL") + " "
                 + ", ".join(f"{k}={v}" for k, v in report["checks"].items()))
    return "\n".join(lines)


def format_slow(s: Mapping[str, Any]) -> str:
    """The slow readers' line: their answers, and the server's RSS while they held back."""
    growth = "n/a (no clean stretch)" if s["max_growth_mb"] is None else \
        f"+{s['max_growth_mb']:.0f} MB"
    return (f"slow readers {s['readers']}: {s['stretches']} stretches, {s['requests']} "
            f"requests of {s['answer_mib']:.2f} MiB answers, answered {s['answered']}, "
            f"lost {s['lost']}, corrupted {s['corrupted']}, failed {s['failed']}"
            f"{' ' + str(s['failures_by_code']) if s['failures_by_code'] else ''}, "
            f"resumes {s['resumes']}; server RSS while "
            f"holding: max {s['rss_max_mb'] or 0:.0f} MB, growth over {s['clean_stretches']} "
            f"clean stretches {growth} (bound {s['bound_mb']:.0f} MB: budget "
            f"{s['per_stream_budget_mib']:.0f} MiB/stream, {s['total_budget_mib']:.0f} MiB "
            f"total, + {s.get('rest_answers_mib', 0):.0f} MiB of REST answers held; unpaced "
            f"window {s['unpaced_mib']:.0f} MiB)")
