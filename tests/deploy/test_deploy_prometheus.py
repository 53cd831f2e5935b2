"""Prometheus rules: promtool checks and unit tests, a mutation that must fail them, and every
metric and label value the rules use read from a real server's /metrics."""

from __future__ import annotations

import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import grpc
import pytest
import yaml

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from tests.deploy.conftest import DEPLOY
from tests.deploy.promql_names import Exposition, check_query, parse_query
from tests.tiny_model import MakeCheckpoint, start

PROM = DEPLOY / "prometheus"


def _promtool(promtool: str, *args: str, cwd: Path = PROM) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_check_rules(promtool: str) -> None:
    proc = _promtool(promtool, "check", "rules", "rules.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 11 rules found" in proc.stdout


def test_check_config(promtool: str) -> None:
    proc = _promtool(promtool, "check", "config", "prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rule_unit_tests(promtool: str) -> None:
    proc = _promtool(promtool, "test", "rules", "rules_test.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_rule_unit_tests_catch_a_changed_threshold(promtool: str, tmp_path: Path) -> None:
    """Mutation: raise the p99 threshold above the test's 497.5 ms and the tests must fail."""
    rules = (PROM / "rules.yml").read_text()
    assert rules.count("p99_5m > 0.25") == 1
    (tmp_path / "rules.yml").write_text(rules.replace("p99_5m > 0.25", "p99_5m > 0.6"))
    shutil.copy(PROM / "rules_test.yml", tmp_path / "rules_test.yml")
    proc = _promtool(promtool, "test", "rules", "rules_test.yml", cwd=tmp_path)
    assert proc.returncode == 1
    assert "alertname: EmbedHighLatencyP99, time: 20m" in proc.stdout + proc.stderr


def _scrape(handle: ServerHandle) -> str:
    url = f"http://127.0.0.1:{handle.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def _rule_exprs() -> list[str]:
    doc = yaml.safe_load((PROM / "rules.yml").read_text())
    return [rule["expr"] for group in doc["groups"] for rule in group["rules"]]


def test_rules_use_only_metrics_and_labels_the_server_exports(server: ServerHandle) -> None:
    """Names drift silently: a rule on a metric nobody exports never fires."""
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        stub.Embed(pb.EmbedRequest(model="tiny", text="hello"), timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            stub.Embed(pb.EmbedRequest(model="tiny"), timeout=30)  # empty input
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    exposition = _scrape(server)
    exported = set(re.findall(r"^([a-z_:]+)(?:\{|\s)", exposition, re.M))
    used = {name for expr in _rule_exprs()
            for name in re.findall(r"\bembed_[a-z_]+\b", expr)}
    assert used == {"embed_requests_total", "embed_request_duration_seconds_bucket",
                    "embed_queue_tokens", "embed_inflight_requests", "embed_model_info",
                    "embed_model_loads_total"}
    assert used <= exported, used - exported
    # The label values the rules match on, as the server writes them.
    assert re.search(r'^embed_requests_total\{[^}]*code="OK"', exposition, re.M)
    assert re.search(r'^embed_requests_total\{[^}]*code="INVALID_ARGUMENT"', exposition, re.M)
    assert re.search(r'^embed_model_loads_total\{[^}]*result="ok"', exposition, re.M)


def test_a_refused_version_exports_result_error(tmp_path: Path,
                                                make_checkpoint: MakeCheckpoint) -> None:
    """EmbedModelLoadFailures matches result="error": a corrupt version really produces it."""
    make_checkpoint(tmp_path, "tiny", version=1)
    bad = make_checkpoint(tmp_path, "tiny", version=2, seed=1)
    blob = bytearray((bad / "embeddings.safetensors").read_bytes())
    blob[-1] ^= 0xFF  # the sha256 in the manifest no longer matches
    (bad / "embeddings.safetensors").write_bytes(bytes(blob))
    handle = start(tmp_path)
    try:
        exposition = _scrape(handle)
    finally:
        handle.stop()
    assert 'embed_model_loads_total{model="tiny",result="error"} 1.0' in exposition
    assert 'embed_model_loads_total{model="tiny",result="ok"} 1.0' in exposition
    assert re.search(r'^embed_model_info\{[^}]*version="1"', exposition, re.M)


def test_rules_names_labels_and_values_against_a_live_server(
        tmp_path: Path, make_checkpoint: MakeCheckpoint) -> None:
    """Every rule's series, matchers, matched values and grouping labels, through the same
    PromQL checker as the Grafana dashboard, against a server that has served OK and
    INVALID_ARGUMENT requests and refused a corrupt version (result="error")."""
    make_checkpoint(tmp_path, "tiny", version=1)
    bad = make_checkpoint(tmp_path, "tiny", version=2, seed=1)
    blob = bytearray((bad / "embeddings.safetensors").read_bytes())
    blob[-1] ^= 0xFF
    (bad / "embeddings.safetensors").write_bytes(bytes(blob))
    handle = start(tmp_path)
    try:
        with grpc.insecure_channel(handle.target) as channel:
            stub = pb_grpc.EmbeddingServiceStub(channel)
            stub.Embed(pb.EmbedRequest(model="tiny", text="hello"), timeout=30)
            with pytest.raises(grpc.RpcError):
                stub.Embed(pb.EmbedRequest(model="tiny"), timeout=30)
        exposition = Exposition(_scrape(handle))
    finally:
        handle.stop()
    doc = yaml.safe_load((PROM / "rules.yml").read_text())
    rules = [rule for group in doc["groups"] for rule in group["rules"]]
    # A recorded series carries the labels its expression keeps (its outer by (...) clause).
    recorded = {r["record"]: parse_query(r["expr"]).grouping - {"le"}
                for r in rules if "record" in r}
    assert recorded == {
        "embed:requests:rate5m": {"rpc", "model", "code"},
        "embed:request_errors:ratio_rate5m": {"model"},
        "embed:request_server_errors:ratio_rate5m": {"model"},
        "embed:request_duration_seconds:p99_5m": {"rpc", "model"},
        "embed:request_duration_seconds:p50_5m": {"rpc", "model"},
    }
    problems = {r.get("record") or r["alert"]: check_query(r["expr"], exposition,
                                                           recorded=recorded)
                for r in rules}
    assert problems == {name: [] for name in problems}
    assert len(problems) == 11
    # Negative control: the value check really reads the exposition.
    assert check_query('embed_model_loads_total{result="failed"}', exposition) == [
        "series 'embed_model_loads_total' never has result='failed'"]
