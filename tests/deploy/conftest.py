"""Fixtures for the deployment tests: the external tools, and the rendered overlays.

promtool comes from scripts/install_promtool.sh, kubectl and kubernetes-validate from
scripts/install_k8s_tools.sh (into .tools/, not .venv); `make test` runs both first. A
missing tool fails its tests with the script to run: they never pass by skipping.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
TOOLS_BIN = REPO / ".tools" / "venv" / "bin"
OVERLAYS = ("cpu", "gpu", "cpu-model-image", "cpu-network-policy", "cpu-prometheus-operator",
            "cpu-exposed", "shm-sidecar")
# Custom resources kubernetes-validate has no schema for (checked by validate_crds.py).
CRD_API_GROUPS = ("monitoring.coreos.com/",)


def _find(name: str, installer: str) -> str:
    """Path of tool ``name`` (.tools first, then PATH), or fail naming its installer."""
    local = TOOLS_BIN / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is not None:
        return found
    pytest.fail(f"{name} not found: run scripts/{installer} (make test does)")


@pytest.fixture(scope="session")
def promtool() -> str:
    """The promtool binary."""
    return _find("promtool", "install_promtool.sh")


@pytest.fixture(scope="session")
def kubectl() -> str:
    """A kubectl whose built-in kustomize is v5 (components, labels)."""
    path = _find("kubectl", "install_k8s_tools.sh")
    out = subprocess.run([path, "version", "--client"], capture_output=True, text=True,
                         check=True).stdout
    assert "Kustomize Version: v5" in out, out
    return path


@pytest.fixture(scope="session")
def kubernetes_validate() -> str:
    """The kubernetes-validate command (offline schemas)."""
    return _find("kubernetes-validate", "install_k8s_tools.sh")


@pytest.fixture(scope="session")
def crd_python() -> str:
    """The tools interpreter, with the Prometheus Operator's CRD models (validate_crds.py)."""
    python = TOOLS_BIN / "python"
    ok = python.exists() and subprocess.run(
        [str(python), "-c", "import cloudcoil.models.prometheus_operator, jsonschema"],
        capture_output=True, timeout=120).returncode == 0
    if not ok:
        pytest.fail("Prometheus Operator CRD models not found: run scripts/install_k8s_tools.sh"
                    " (make test does)")
    return str(python)


@pytest.fixture(scope="session")
def rendered(kubectl: str) -> dict[str, str]:
    """``kubectl kustomize`` output (YAML text) of every overlay."""
    out: dict[str, str] = {}
    for overlay in OVERLAYS:
        proc = subprocess.run([kubectl, "kustomize", str(DEPLOY / "k8s" / "overlays" / overlay)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        out[overlay] = proc.stdout
    return out


@pytest.fixture(scope="session")
def manifests(rendered: dict[str, str]) -> dict[str, dict[tuple[str, str], dict[str, Any]]]:
    """Every overlay's objects as {(kind, name): object}."""
    out: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
    for overlay, text in rendered.items():
        docs = [d for d in yaml.safe_load_all(text) if d]
        by_key = {(d["kind"], d["metadata"]["name"]): d for d in docs}
        assert len(by_key) == len(docs), f"{overlay}: duplicate kind/name"
        out[overlay] = by_key
    return out
