"""Names in PromQL queries, checked against a live /metrics exposition.

A dashboard panel or alert on a metric nobody exports shows "No data" forever, and nothing
else complains. This module pulls out of a PromQL query (as Grafana stores it, with
``$variables``) the series names it selects, the label matchers on each, and the labels it
groups by, and checks them against what a real server exports.

It is a small tokenizer, not a PromQL parser: it understands selectors, ``{...}`` matchers,
``[...]`` ranges (skipped whole, so ``[$__rate_interval]`` is fine), strings, numbers and
durations, function calls, and the grouping clauses ``by``/``without``/``on``/``ignoring``/
``group_left``/``group_right``. Grafana's ``label_values(selector, label)`` is understood too.

Names are checked as Prometheus stores them: a histogram family ``F`` exists only as
``F_bucket`` (with ``le``), ``F_sum`` and ``F_count``, a counter ``C`` as ``C_total``; so a
query must name one of those, and the check reads the sample names of the exposition.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["TARGET_LABELS", "Exposition", "Query", "check_query", "parse_query"]

# Added by Prometheus to every scraped series (the scrape target's identity), never exported.
TARGET_LABELS = frozenset({"job", "instance"})

_GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
# Words that are PromQL syntax, never series names: binary operators, modifiers, and the
# aggregation operators (their "(" may come after a by/without clause: sum by (x) (...)).
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
                       "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
                       "count_values", "bottomk", "topk", "quantile", "limitk",
                       "limit_ratio"})

_TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[a-zA-Z]*)
  | (?P<var>\$\{[^}]*\}|\$\w+)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[=<>+\-*/%^,(){}\[\]@])
""", re.VERBOSE)


@dataclass(frozen=True)
class Matcher:
    """One ``label op "value"`` inside a selector's braces."""

    label: str
    op: str
    value: str


@dataclass
class Selector:
    """A series selector: the series name and its label matchers."""

    name: str
    matchers: list[Matcher] = field(default_factory=list)


@dataclass
class Query:
    """What a query names: its selectors and the labels it groups or joins on."""

    selectors: list[Selector] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot tokenize {expr[pos:pos + 20]!r} in {expr!r}")
        pos = m.end()
        kind = m.lastgroup
        assert kind is not None
        if kind != "space":
            out.append((kind, m.group()))
    return out


def _unquote(token: str) -> str:
    if token[0] == "`":
        return token[1:-1]
    return bytes(token[1:-1], "utf-8").decode("unicode_escape")


def _matchers(tokens: list[tuple[str, str]], i: int, expr: str) -> tuple[list[Matcher], int]:
    """Matchers from tokens[i] (just after "{") to the closing "}"; returns the next index."""
    out: list[Matcher] = []
    while tokens[i] != ("op", "}"):
        if tokens[i] == ("op", ","):
            i += 1
            continue
        (k1, label), (_, op), (k3, value) = tokens[i:i + 3]
        if k1 != "ident" or op not in ("=", "!=", "=~", "!~") or k3 != "string":
            raise ValueError(f"bad label matcher near {label!r} in {expr!r}")
        out.append(Matcher(label, op, _unquote(value)))
        i += 3
    return out, i + 1


def parse_query(expr: str) -> Query:
    """The selectors and grouping labels of one PromQL (or Grafana ``label_values``) query."""
    lv = re.fullmatch(r"\s*label_values\((.*),\s*([a-zA-Z_]\w*)\s*\)\s*", expr, re.S)
    if lv is not None:
        query = parse_query(lv.group(1))
        query.grouping.add(lv.group(2))  # the label must exist on that selector's series
        return query
    tokens = _tokens(expr)
    query = Query()
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
        if kind == "op" and text == "[":
            # Range or subquery: durations and $__rate_interval, no names; skip to "]".
            while tokens[i] != ("op", "]"):
                i += 1
            i += 1
        elif kind == "ident" and text in _GROUPING:
            i += 1
            if nxt == ("op", "("):
                i += 1
                while tokens[i] != ("op", ")"):
                    if tokens[i][0] == "ident":
                        query.grouping.add(tokens[i][1])
                    i += 1
                i += 1
        elif kind == "ident" and nxt == ("op", "("):
            i += 1  # a function or aggregation: its arguments follow
        elif kind == "ident" and text.lower() not in _KEYWORDS:
            selector = Selector(text)
            i += 1
            if nxt == ("op", "{"):
                selector.matchers, i = _matchers(tokens, i + 1, expr)
            query.selectors.append(selector)
        elif kind == "op" and text == "{":
            matchers, i = _matchers(tokens, i + 1, expr)
            names = [m.value for m in matchers if m.label == "__name__" and m.op == "="]
            if len(names) != 1:
                raise ValueError(f"selector without one exact __name__ in {expr!r}")
            query.selectors.append(Selector(names[0], [m for m in matchers
                                                       if m.label != "__name__"]))
        else:
            i += 1
    return query


class Exposition:
    """Series names, their label names and label values, from /metrics text."""

    def __init__(self, text: str) -> None:
        self.labels: dict[str, set[str]] = {}
        self.values: dict[tuple[str, str], set[str]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.labels.setdefault(sample.name, set()).update(sample.labels)
                for label, value in sample.labels.items():
                    self.values.setdefault((sample.name, label), set()).add(value)


def check_query(expr: str, exposition: Exposition,
                extra_labels: Iterable[str] = TARGET_LABELS,
                recorded: Mapping[str, Iterable[str]] | None = None) -> list[str]:
    """Problems with ``expr`` against ``exposition`` (empty list: every name exists).

    Each selected series must be exported (or be one of ``recorded``, series that recording
    rules make, with their labels); each matcher's label must be on it (or be a target label
    Prometheus adds), and an exact ``=``/``!=`` value without a ``$variable`` must be one the
    server wrote; each grouping label must be on every series the query selects.
    """
    query = parse_query(expr)
    extra = set(extra_labels)
    known = {name: set(labels) for name, labels in (recorded or {}).items()}
    problems: list[str] = []
    if not query.selectors:
        problems.append(f"no series selected in {expr!r}")
    for selector in query.selectors:
        if selector.name in known:
            missing = {m.label for m in selector.matchers} - known[selector.name] - extra
            problems += [f"series {selector.name!r} has no label {label!r}"
                         for label in sorted(missing)]
            continue
        labels = exposition.labels.get(selector.name)
        if labels is None:
            problems.append(f"series {selector.name!r} is not exported")
            continue
        for m in selector.matchers:
            if m.label not in labels | extra:
                problems.append(f"series {selector.name!r} has no label {m.label!r}")
            elif (m.op in ("=", "!=") and "$" not in m.value and m.label not in extra
                  and m.value not in exposition.values.get((selector.name, m.label), set())):
                problems.append(f"series {selector.name!r} never has {m.label}={m.value!r}")
    for label in sorted(query.grouping):
        for selector in query.selectors:
            labels = known.get(selector.name, exposition.labels.get(selector.name))
            if labels is not None and label not in labels | extra:
                problems.append(f"grouping label {label!r} is not on {selector.name!r}")
    return problems
