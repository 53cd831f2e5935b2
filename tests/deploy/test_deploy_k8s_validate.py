"""Every rendered overlay (and the PyTorchJob's pod template) passes strict schema validation."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import DEPLOY, OVERLAYS

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
    # One "passed" line per object: nothing was silently left unchecked.
    lines = (proc.stdout + proc.stderr).splitlines()
    passed = [ln for ln in lines if " passed for resource " in ln]
    assert len(passed) == len(manifests[overlay])


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
