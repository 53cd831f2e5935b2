"""Write the Prometheus Operator's PrometheusRule from deploy/prometheus/rules.yml.

rules.yml is the one hand-maintained copy of the rules (promtool checks and unit-tests it);
the PrometheusRule in components/prometheus-operator is generated from it, never edited:

    python deploy/prometheus/to_prometheusrule.py          # rewrite the PrometheusRule
    python deploy/prometheus/to_prometheusrule.py --check  # exit 1 if it is stale

tests/deploy checks that the committed file is exactly what this script writes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[1]
RULES = DEPLOY / "prometheus" / "rules.yml"
OUTPUT = DEPLOY / "k8s" / "components" / "prometheus-operator" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/prometheus/rules.yml by deploy/prometheus/to_prometheusrule.py.
# Do not edit: change rules.yml (and rules_test.yml), then run
#   python deploy/prometheus/to_prometheusrule.py
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the longer PromQL expressions) as literal blocks, as in rules.yml."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def prometheus_rule(rules: dict[str, Any]) -> dict[str, Any]:
    """The PrometheusRule object carrying ``rules``' groups unchanged."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "embedding-service"},
        "spec": {"groups": rules["groups"]},
    }


def render(rules_text: str) -> str:
    """The generated file's text for the given rules.yml text."""
    body = yaml.dump(prometheus_rule(yaml.safe_load(rules_text)), Dumper=_Dumper,
                     sort_keys=False, width=1000, allow_unicode=True)
    return HEADER + body


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, compare) the generated PrometheusRule."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = render(RULES.read_text())
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python {Path(__file__).relative_to(DEPLOY.parent)}",
                  file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
