"""The Grafana dashboard: its layout, and every query in it against a live server's /metrics.

A panel on a misspelt metric or label shows "No data" and nothing else complains, so each
query's series, matchers and grouping labels are checked (tests/deploy/promql_names.py)
against the exposition of a real server that has served good and bad requests.
"""

from __future__ import annotations

import copy
import json
import urllib.request
from typing import Any

import grpc
import pytest

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.embedding.v1 import embedding_pb2_grpc as pb_grpc
from service.local import ServerHandle
from tests.deploy.conftest import DEPLOY
from tests.deploy.promql_names import Exposition, check_query, parse_query

DASHBOARD = DEPLOY / "grafana" / "embedding-service.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# Every family service/metrics.py exports (docs/deploy.md's list); the dashboard shows each.
FAMILIES = {
    "embed_requests_total", "embed_request_duration_seconds", "embed_queue_duration_seconds",
    "embed_tokenize_duration_seconds", "embed_compute_duration_seconds", "embed_batch_tokens",
    "embed_batch_requests", "embed_tokens_total", "embed_output_bytes_total",
    "embed_inflight_requests", "embed_queue_tokens", "embed_untrained_token_lookups_total",
    "embed_model_info", "embed_model_loads_total",
}


def _load() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def _queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL query: panel targets and the template variables' label_values()."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"]
              if v["type"] == "query"]
    return exprs


def dashboard_problems(dashboard: dict[str, Any], exposition: Exposition) -> dict[str, list[str]]:
    """{query: problems} for the queries that name something the server does not export."""
    out = {}
    for expr in _queries(dashboard):
        problems = check_query(expr, exposition)
        if problems:
            out[expr] = problems
    return out


def _family(series: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if series.endswith(suffix):
            return series[: -len(suffix)]
    return series


def test_dashboard_layout() -> None:
    dash = _load()
    assert (dash["uid"], dash["title"], dash["schemaVersion"]) == (
        "embedding-service", "Embedding service", 39)
    variables = [(v["name"], v["type"]) for v in dash["templating"]["list"]]
    assert variables == [("datasource", "datasource"), ("job", "query"), ("model", "query")]
    panels = dash["panels"]
    assert [p["id"] for p in panels] == list(range(1, len(panels) + 1))
    graphs = [p for p in panels if p["type"] != "row"]
    assert len(graphs) == 15
    cells: set[tuple[int, int]] = set()
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24, p["title"]
        area = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not area & cells, f"{p['title']} overlaps another panel"
        cells |= area
    for p in graphs:
        # The data source is the variable, so importing asks for none and any Prometheus works.
        assert p["datasource"] == DATASOURCE, p["title"]
        assert p["targets"], p["title"]
        assert [t["refId"] for t in p["targets"]] == [chr(65 + i) for i in range(len(p["targets"]))]
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE
    assert len(_queries(dash)) == 24
    # The REST front's row: its requests are the rpc="http/<endpoint>" series.
    http = [p for p in graphs if p["title"].startswith("HTTP")]
    assert len(http) == 2
    assert all('rpc=~"http/.*"' in t["expr"] for p in http for t in p["targets"])


def test_dashboard_covers_every_exported_family() -> None:
    used = {_family(s.name) for expr in _queries(_load()) for s in parse_query(expr).selectors}
    assert used == FAMILIES


def _traffic_and_scrape(handle: ServerHandle) -> Exposition:
    """OK, untrained-row and INVALID_ARGUMENT requests, then the live /metrics text."""
    with grpc.insecure_channel(handle.target) as channel:
        stub = pb_grpc.EmbeddingServiceStub(channel)
        stub.Embed(pb.EmbedRequest(model="tiny", text="hello"), timeout=30)
        # 31373 is a row the tiny model never trained: embed_untrained_token_lookups_total.
        r = stub.Embed(pb.EmbedRequest(model="tiny", token_ids=pb.TokenIds(ids=[31373, 995])),
                       timeout=30)
        assert list(r.untrained_token_indices) == [0]
        with pytest.raises(grpc.RpcError) as err:
            stub.Embed(pb.EmbedRequest(model="tiny"), timeout=30)  # empty input
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    url = f"http://127.0.0.1:{handle.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return Exposition(resp.read().decode())


@pytest.fixture(scope="module")
def live(server: ServerHandle) -> Exposition:
    """The shared server's exposition after some traffic."""
    return _traffic_and_scrape(server)


def test_every_query_names_only_exported_series_and_labels(live: Exposition) -> None:
    assert dashboard_problems(_load(), live) == {}
    # The check saw the labelled series it needs, not an empty exposition.
    assert live.labels["embed_untrained_token_lookups_total"] == {"model"}
    assert live.labels["embed_output_bytes_total"] == {"model", "dtype"}
    assert live.labels["embed_compute_duration_seconds_bucket"] == {"device", "le"}
    assert {"OK", "INVALID_ARGUMENT"} <= live.values[("embed_requests_total", "code")]


def test_a_panel_with_a_misspelt_metric_fails_the_check(live: Exposition) -> None:
    """Negative control on the real dashboard: one typo'd panel is exactly the one flagged."""
    dash = copy.deepcopy(_load())
    bad = 'sum by (model) (rate(embed_token_total{job=~"$job"}[$__rate_interval]))'
    dash["panels"].append({"type": "timeseries", "title": "typo", "datasource": DATASOURCE,
                           "targets": [{"refId": "A", "expr": bad}]})
    assert dashboard_problems(dash, live) == {bad: ["series 'embed_token_total' is not exported"]}


# A fixed exposition for the checker's own unit tests (no server needed).
_TEXT = """\
# HELP embed_requests_total RPCs.
# TYPE embed_requests_total counter
embed_requests_total{rpc="Embed",model="tiny",code="OK"} 3.0
# HELP embed_request_duration_seconds RPC wall time.
# TYPE embed_request_duration_seconds histogram
embed_request_duration_seconds_bucket{rpc="Embed",model="tiny",le="0.001"} 1.0
embed_request_duration_seconds_bucket{rpc="Embed",model="tiny",le="+Inf"} 3.0
embed_request_duration_seconds_count{rpc="Embed",model="tiny"} 3.0
embed_request_duration_seconds_sum{rpc="Embed",model="tiny"} 0.01
# HELP embed_queue_tokens Queued.
# TYPE embed_queue_tokens gauge
embed_queue_tokens 0.0
"""


@pytest.mark.parametrize(("expr", "problems"), [
    ('sum by (code) (rate(embed_requests_total{job=~"$job", model=~"$model"}[5m]))', []),
    ('histogram_quantile(0.99, sum by (le, rpc) '
     '(rate(embed_request_duration_seconds_bucket[$__rate_interval])))', []),
    ("sum(rate(embed_request_duration_seconds_sum[5m])) "
     "/ sum(rate(embed_request_duration_seconds_count[5m]))", []),
    ("label_values(embed_requests_total, model)", []),
    ('max by (instance) (embed_queue_tokens{job="embedding-service"}) > bool 1e3', []),
    # A misspelt series, a series that never carries the label, and a wrong grouping label.
    ("rate(embed_request_total[5m])", ["series 'embed_request_total' is not exported"]),
    ('embed_queue_tokens{model="tiny"}', ["series 'embed_queue_tokens' has no label 'model'"]),
    ("sum by (modle) (rate(embed_requests_total[5m]))",
     ["grouping label 'modle' is not on 'embed_requests_total'"]),
    ("label_values(embed_queue_tokens, model)",
     ["grouping label 'model' is not on 'embed_queue_tokens'"]),
    # A value the server never writes (status codes are upper case).
    ('embed_requests_total{code!="Ok"}', ["series 'embed_requests_total' never has code='Ok'"]),
    # A histogram is stored as _bucket/_sum/_count: the bare family name selects nothing.
    ("rate(embed_request_duration_seconds[5m])",
     ["series 'embed_request_duration_seconds' is not exported"]),
    # le exists only on _bucket.
    ("sum by (le) (rate(embed_request_duration_seconds_count[5m]))",
     ["grouping label 'le' is not on 'embed_request_duration_seconds_count'"]),
    ("vector(1)", ["no series selected in 'vector(1)'"]),
])
def test_checker(expr: str, problems: list[str]) -> None:
    assert check_query(expr, Exposition(_TEXT)) == problems


def test_parser_reads_selectors_matchers_and_grouping() -> None:
    q = parse_query('sum(rate(a_total{x="1", y=~"$v"}[5m:1m])) by (g) '
                    '/ on (h) group_left (k) b offset 5m')
    assert [(s.name, [(m.label, m.op, m.value) for m in s.matchers]) for s in q.selectors] == [
        ("a_total", [("x", "=", "1"), ("y", "=~", "$v")]), ("b", [])]
    assert q.grouping == {"g", "h", "k"}
