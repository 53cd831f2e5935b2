"""Validate KServe objects (InferenceService, InferenceGraph, ServingRuntime) offline.

Run with the tools interpreter (.tools/venv/bin/python, scripts/install_k8s_tools.sh): it
needs ``jsonschema`` and ``yaml``, which the service's environment does not carry.

    python validate_kserve.py MODELS_DIR K8S_SCHEMA_DIR FILE.yaml...
    # prints one JSON line: {"kind/name": [errors]}; exit 1 if any object has an error

No package ships KServe's CRD schemas as JSON (there is no cloudcoil-models-kserve), so the
schema comes from the KServe Python SDK's generated models (PyPI ``kserve``), which are
generated from the same Go API types as the CRDs. MODELS_DIR is the SDK's ``kserve/models``
folder; its files are parsed with ``ast``, never imported (importing would pull in the whole
SDK and its dependencies). Each class gives:

- ``openapi_types``: field -> type ('str', 'list[V1Container]', 'dict(str, X)', a class);
- ``attribute_map``: field -> JSON key;
- required fields: the setters that raise "must not be `None`".

Every KServe object is closed: a key that is not in ``attribute_map`` is an error (what the
API server's structural pruning would silently drop). Fields typed with a Kubernetes type
(``V1Container``, ``V1ObjectMeta``, ...) are checked against kubernetes-validate's strict
JSON schemas (K8S_SCHEMA_DIR, e.g. ``.../kubernetes-json-schema/v1.30.0-local-strict``),
which are closed too. Not checked: enum values and patterns (the SDK models carry none),
the CRDs' CEL rules and the KServe webhooks' checks.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

# kind -> (apiVersion, SDK class)
KINDS = {
    "InferenceService": ("serving.kserve.io/v1beta1", "V1beta1InferenceService"),
    "InferenceGraph": ("serving.kserve.io/v1alpha1", "V1alpha1InferenceGraph"),
    "ServingRuntime": ("serving.kserve.io/v1alpha1", "V1alpha1ServingRuntime"),
}
_REQUIRED = re.compile(r"Invalid value for `(\w+)`, must not be `None`")
_LIST = re.compile(r"^list\[(.+)\]$")
_DICT = re.compile(r"^dict\(str, (.+)\)$")


@dataclass(frozen=True)
class Model:
    """One SDK class: field -> type, field -> JSON key, and the required fields."""

    types: dict[str, str]
    keys: dict[str, str]
    required: frozenset[str]


def load_models(models_dir: Path) -> dict[str, Model]:
    """Every generated class in ``models_dir``, by class name."""
    out: dict[str, Model] = {}
    for path in sorted(models_dir.glob("v1*.py")):
        source = path.read_text()
        for node in ast.parse(source).body:
            if not isinstance(node, ast.ClassDef):
                continue
            tables: dict[str, dict[str, str]] = {}
            for stmt in node.body:
                if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                        and isinstance(stmt.targets[0], ast.Name)
                        and stmt.targets[0].id in ("openapi_types", "attribute_map")):
                    tables[stmt.targets[0].id] = ast.literal_eval(stmt.value)
            if len(tables) == 2:
                out[node.name] = Model(tables["openapi_types"], tables["attribute_map"],
                                       frozenset(_REQUIRED.findall(source)))
    return out


class Validator:
    """Walks an object along the SDK's types; Kubernetes types go to the strict schemas."""

    def __init__(self, models: dict[str, Model], k8s_schema_dir: Path) -> None:
        self.models = models
        # One 2020-12 document, "$id" https://kubernetes.io/api/_definitions.json, whose
        # "$defs" refer to each other by that absolute URI: it goes into a registry whole.
        document = json.loads((k8s_schema_dir / "_definitions.json").read_text())
        self._base = document["$id"]
        self.definitions: dict[str, Any] = document["$defs"]
        self._registry: Registry[Any] = Resource.from_contents(document) @ Registry()
        self._k8s: dict[str, Draft202012Validator] = {}

    def _k8s_validator(self, type_name: str) -> Draft202012Validator | None:
        """The strict schema of ``V1Foo``: core/v1 Foo, else meta/v1 Foo (e.g. ObjectMeta)."""
        if type_name not in self._k8s:
            m = re.match(r"^V(\d\w*?)([A-Z]\w*)$", type_name)
            if m is None:
                return None
            version, kind = "v" + m[1].lower(), m[2]
            for group in ("io.k8s.api.core", "io.k8s.apimachinery.pkg.apis.meta"):
                name = f"{group}.{version}.{kind}"
                if name in self.definitions:
                    schema = {"$ref": f"{self._base}#/$defs/{name}"}
                    self._k8s[type_name] = Draft202012Validator(schema, registry=self._registry)
                    break
            else:
                return None
        return self._k8s[type_name]

    def check(self, value: Any, type_name: str, path: str) -> list[str]:
        """Errors of ``value`` against ``type_name``, each prefixed with its path."""
        if (m := _LIST.match(type_name)) is not None:
            if not isinstance(value, list):
                return [f"{path}: expected a list, got {type(value).__name__}"]
            return [e for i, v in enumerate(value) for e in self.check(v, m[1], f"{path}[{i}]")]
        if (m := _DICT.match(type_name)) is not None:
            if not isinstance(value, dict):
                return [f"{path}: expected a mapping, got {type(value).__name__}"]
            return [e for k, v in value.items() for e in self.check(v, m[1], f"{path}.{k}")]
        # bool is an int in Python, but `true` is not a valid int (or float) field value.
        scalar: dict[str, type | tuple[type, ...]] = {
            "str": str, "bool": bool, "int": int, "float": (int, float)}
        if type_name in scalar:
            ok = isinstance(value, scalar[type_name]) and (
                type_name == "bool" or not isinstance(value, bool))
            return [] if ok else [f"{path}: expected {type_name}, got {value!r}"]
        if type_name == "object":
            return []
        if type_name in self.models:
            return self._check_model(value, self.models[type_name], path)
        validator = self._k8s_validator(type_name)
        if validator is None:
            # Fail loudly: a type with no schema must never pass unchecked.
            return [f"{path}: no schema for type {type_name}"]
        return [path + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.path)
                + f": {e.message}"
                for e in sorted(validator.iter_errors(value), key=lambda e: str(list(e.path)))]

    def _check_model(self, value: Any, model: Model, path: str) -> list[str]:
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, got {type(value).__name__}"]
        by_key = {key: field for field, key in model.keys.items()}
        errors = [f"{path}: unknown field {key!r}" for key in value if key not in by_key]
        errors += [f"{path}: missing required field {model.keys[field]!r}"
                   for field in sorted(model.required) if model.keys[field] not in value]
        for key, v in value.items():
            if key in by_key:
                errors += self.check(v, model.types[by_key[key]], f"{path}.{key}")
        return errors

    def validate(self, obj: dict[str, Any]) -> list[str]:
        """Errors of one object; apiVersion, kind, metadata.name and spec are required."""
        kind = obj.get("kind")
        if kind not in KINDS:
            return [f"no schema for kind {kind!r}"]
        api_version, class_name = KINDS[kind]
        errors = [] if obj.get("apiVersion") == api_version else [
            f"apiVersion: expected {api_version!r}, got {obj.get('apiVersion')!r}"]
        errors += [f"missing {k}" for k in ("metadata", "spec") if k not in obj]
        if not obj.get("metadata", {}).get("name"):
            errors.append("metadata.name: required")
        return errors + self.check(obj, class_name, "")


def validate_files(models_dir: Path, k8s_schema_dir: Path,
                   paths: list[Path]) -> dict[str, list[str]]:
    """{kind/name: [errors]} for every object in ``paths``; an empty list means valid."""
    validator = Validator(load_models(models_dir), k8s_schema_dir)
    out: dict[str, list[str]] = {}
    for path in paths:
        for obj in yaml.safe_load_all(path.read_text()):
            if obj:
                out[f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"] = \
                    validator.validate(obj)
    return out


def main(argv: list[str]) -> int:
    """CLI: MODELS_DIR K8S_SCHEMA_DIR FILE...; exit 1 if any object is invalid."""
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    result = validate_files(Path(argv[0]), Path(argv[1]), [Path(p) for p in argv[2:]])
    print(json.dumps(result, sort_keys=True))
    return 1 if any(result.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
