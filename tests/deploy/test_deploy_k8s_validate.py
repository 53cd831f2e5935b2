"""Every rendered overlay (and the PyTorchJob's pod template) passes strict schema validation.

Core objects go through kubernetes-validate --strict. It has no schema for the Prometheus
Operator's ServiceMonitor and PrometheusRule: those go through validate_crds.py (the operator's
CRD schemas from PyPI's cloudcoil-models-prometheus-operator, closed to unknown fields), and the
PrometheusRule's rule groups through promtool (check rules, and rules_test.yml's unit tests).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import CRD_API_GROUPS, DEPLOY, OVERLAYS

# Oldest Kubernetes the manifests target: native gRPC probes are GA from 1.27.
K8S_VERSION = "1.30.0"


def _validate(tool: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool, "--strict", "-k", K8S_VERSION, str(path)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_validates_strict(overlay: str, rendered: dict[str, str],
                                  manifests: dict[str, dict[tuple[str, str], Any]],
                                  kubernetes_validate: str, tmp_path: Path) -> None:
    path = tmp_path / f"{overlay}.yaml"
    path.write_text(rendered[overlay])
    proc = _validate(kubernetes_validate, path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # One "passed" line per core object: nothing was silently left unchecked. The custom
    # resources are the only objects it has no schema for (they are checked below).
    lines = (proc.stdout + proc.stderr).splitlines()
    passed = [ln for ln in lines if " passed for resource " in ln]
    crds = sorted(kind for (kind, _), obj in manifests[overlay].items()
                  if obj["apiVersion"].startswith(CRD_API_GROUPS))
    assert len(passed) == len(manifests[overlay]) - len(crds)
    unknown = sorted(ln.split("schema for kind ")[1].split()[0] for ln in lines
                     if "Couldn't find schema" in ln)
    assert unknown == crds
    assert crds == (["PrometheusRule", "ServiceMonitor"]
                    if overlay == "cpu-prometheus-operator" else [])


def test_validator_rejects_an_unknown_field(manifests: dict[str, dict[tuple[str, str], Any]],
                                            kubernetes_validate: str, tmp_path: Path) -> None:
    """Negative control: --strict really fails on a misspelt field."""
    deployment = json.loads(json.dumps(manifests["cpu"][("Deployment", "embedding-service")]))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"grpc": {}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(deployment))
    proc = _validate(kubernetes_validate, path)
    assert proc.returncode != 0
    assert "readinesProbe" in proc.stdout + proc.stderr


def test_pytorchjob_pod_template_validates_strict(kubernetes_validate: str,
                                                  tmp_path: Path) -> None:
    """The CRD itself has no schema here; its Worker pod template is a core PodTemplateSpec."""
    job = yaml.safe_load((DEPLOY / "k8s" / "training" / "pytorchjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "worker"},
               "template": template}
    path = tmp_path / "worker.yaml"
    path.write_text(yaml.safe_dump(wrapped))
    proc = _validate(kubernetes_validate, path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _operator_objects(manifests: dict[str, dict[tuple[str, str], Any]]) -> list[dict[str, Any]]:
    objs = manifests["cpu-prometheus-operator"]
    return [objs[("PrometheusRule", "embedding-service")],
            objs[("ServiceMonitor", "embedding-service")]]


def _validate_crds(python: str, objects: list[dict[str, Any]],
                   tmp_path: Path) -> tuple[int, dict[str, list[str]]]:
    path = tmp_path / "crds.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    proc = subprocess.run([python, str(Path(__file__).with_name("validate_crds.py")), str(path)],
                          capture_output=True, text=True, timeout=180)
    assert proc.stderr == "", proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_operator_objects_validate_against_their_crd_schemas(
        manifests: dict[str, dict[tuple[str, str], Any]], crd_python: str,
        tmp_path: Path) -> None:
    code, result = _validate_crds(crd_python, _operator_objects(manifests), tmp_path)
    assert (code, result) == (0, {"PrometheusRule/embedding-service": [],
                                  "ServiceMonitor/embedding-service": []})


def test_crd_validator_rejects_misspelt_and_malformed_fields(
        manifests: dict[str, dict[tuple[str, str], Any]], crd_python: str,
        tmp_path: Path) -> None:
    """Negative control: unknown fields, a bad enum, a bad duration, a missing expr."""
    rule, monitor = json.loads(json.dumps(_operator_objects(manifests)))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    monitor["spec"]["endpoints"][0]["scheme"] = "htp"
    rule["spec"]["groups"][0]["rules"][0]["fro"] = "5m"
    rule["spec"]["groups"][1]["rules"][0]["for"] = "10 minutes"
    del rule["spec"]["groups"][1]["rules"][1]["expr"]
    del monitor["spec"]["selector"]
    code, result = _validate_crds(crd_python, [rule, monitor], tmp_path)
    duration = ("'^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?"
                "(([0-9]+)ms)?)$'")
    assert code == 1
    assert result == {
        "PrometheusRule/embedding-service": [
            "spec.groups.0.rules.0: Additional properties are not allowed ('fro' was unexpected)",
            f"spec.groups.1.rules.0.for: '10 minutes' does not match {duration}",
            "spec.groups.1.rules.1: 'expr' is a required property",
        ],
        "ServiceMonitor/embedding-service": [
            "spec: 'selector' is a required property",
            "spec.endpoints.0: Additional properties are not allowed ('intervall' was unexpected)",
            "spec.endpoints.0.scheme: 'htp' is not one of ['http', 'https']",
        ],
    }


def test_prometheusrule_groups_pass_promtool(manifests: dict[str, dict[tuple[str, str], Any]],
                                             promtool: str, tmp_path: Path) -> None:
    """The groups the operator would load pass promtool and the same rule unit tests."""
    rule = manifests["cpu-prometheus-operator"][("PrometheusRule", "embedding-service")]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    shutil.copy(DEPLOY / "prometheus" / "rules_test.yml", tmp_path / "rules_test.yml")
    check = subprocess.run([promtool, "check", "rules", "rules.yml"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 11 rules found" in check.stdout
    test = subprocess.run([promtool, "test", "rules", "rules_test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout


def test_every_overlay_and_component_is_validated() -> None:
    """A new overlay directory cannot skip the checks above, and no component goes unbuilt."""
    k8s = DEPLOY / "k8s"
    assert sorted(p.name for p in (k8s / "overlays").iterdir()) == sorted(OVERLAYS)
    used = {Path(c).name for overlay in OVERLAYS
            for c in yaml.safe_load((k8s / "overlays" / overlay / "kustomization.yaml")
                                    .read_text()).get("components", [])}
    assert sorted(p.name for p in (k8s / "components").iterdir()) == sorted(used)
    assert used == {"model-image", "network-policy", "prometheus-operator", "exposed"}
    # Every other kustomization (training job, importer) is parsed by test_deploy_commands.py.
    from tests.deploy.pod_specs import KUSTOMIZATIONS
    apart = {p.parent.name for p in k8s.glob("*/kustomization.yaml")}
    assert apart == {"base", "training", "import"}
    assert {"training", "import"} <= set(KUSTOMIZATIONS)


def test_importer_job_validates_strict(kubectl: str, kubernetes_validate: str,
                                       tmp_path: Path) -> None:
    proc = subprocess.run([kubectl, "kustomize", str(DEPLOY / "k8s" / "import")],
                          capture_output=True, text=True, timeout=60, check=True)
    path = tmp_path / "import.yaml"
    path.write_text(proc.stdout)
    out = _validate(kubernetes_validate, path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (out.stdout + out.stderr).count(" passed for resource ") == 1
