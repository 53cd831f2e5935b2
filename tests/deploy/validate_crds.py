"""Validate Prometheus Operator objects (ServiceMonitor, PrometheusRule) against a schema.

Run with the tools interpreter (.tools/venv/bin/python, scripts/install_k8s_tools.sh), not the
service's: it needs ``cloudcoil.models.prometheus_operator`` (PyPI; pydantic models generated
from the operator's CRD OpenAPI schemas) and ``jsonschema``, neither of which the service uses.

    python validate_crds.py FILE.yaml...   # prints one JSON line: {"kind/name": [errors]}

kubernetes-validate ships core Kubernetes schemas only. The models' JSON schema carries the
CRDs' field names, types, required fields, enums and patterns; pydantic itself would ignore
unknown fields, so every object schema here is closed (additionalProperties: false), which is
what the API server's structural-schema pruning amounts to, but reported instead of dropped.
The objects' apiVersion, kind, metadata.name and spec are required, as the API server does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml
from cloudcoil.models.prometheus_operator import v1
from jsonschema import Draft202012Validator

KINDS = {"ServiceMonitor": v1.ServiceMonitor, "PrometheusRule": v1.PrometheusRule}
API_VERSION = "monitoring.coreos.com/v1"


def _close(node: Any) -> None:
    """Close every object schema that lists its properties, and drop pydantic's null arms.

    pydantic writes an optional field as anyOf [X, {"type": "null"}]; a Kubernetes object
    has no null fields, and with the arm gone an error is reported at the field that is
    wrong, not as "not valid under any of the given schemas" at the whole group list.
    """
    if isinstance(node, dict):
        arms = node.get("anyOf")
        if isinstance(arms, list) and {"type": "null"} in arms and len(arms) == 2:
            (arm,) = [a for a in arms if a != {"type": "null"}]
            del node["anyOf"]
            node.update(arm)
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            _close(value)
    elif isinstance(node, list):
        for value in node:
            _close(value)


def schema(kind: str) -> dict[str, Any]:
    """The closed JSON schema of one kind."""
    out: dict[str, Any] = KINDS[kind].model_json_schema(by_alias=True, mode="validation")
    _close(out)
    out["required"] = ["apiVersion", "kind", "metadata", "spec"]
    out["properties"]["apiVersion"] = {"const": API_VERSION}
    out["properties"]["kind"] = {"const": kind}
    out["properties"]["metadata"] = {"allOf": [{"$ref": "#/$defs/ObjectMeta"},
                                               {"required": ["name"]}]}
    return out


def validate(objects: list[dict[str, Any]]) -> dict[str, list[str]]:
    """{kind/name: [error messages]} for every object; an empty list means valid."""
    validators = {kind: Draft202012Validator(schema(kind)) for kind in KINDS}
    out: dict[str, list[str]] = {}
    for obj in objects:
        kind = obj.get("kind")
        key = f"{kind}/{obj.get('metadata', {}).get('name')}"
        if kind not in validators:
            out[key] = [f"no schema for kind {kind!r}"]
            continue
        errors = sorted(validators[kind].iter_errors(obj), key=lambda e: list(e.path))
        out[key] = [f"{'.'.join(str(p) for p in e.path) or '<root>'}: {e.message}"
                    for e in errors]
    return out


def main(paths: list[str]) -> int:
    """Validate every object in ``paths``; exit 1 if any is invalid."""
    objects = [d for p in paths for d in yaml.safe_load_all(Path(p).read_text()) if d]
    result = validate(objects)
    print(json.dumps(result, sort_keys=True))
    return 1 if any(result.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
