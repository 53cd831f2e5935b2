"""Exact structural checks on the rendered overlays, and their config through the real parser."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.config import ServerConfig, parse_config
from tests.deploy.conftest import DEPLOY, OVERLAYS

Objects = dict[tuple[str, str], dict[str, Any]]
NAME = "embedding-service"


def _pod(objs: Objects) -> dict[str, Any]:
    return objs[("Deployment", NAME)]["spec"]["template"]


def _server(objs: Objects) -> dict[str, Any]:
    (container,) = _pod(objs)["spec"]["containers"]
    assert container["name"] == "server"
    return container


def _config(objs: Objects) -> dict[str, str]:
    """The ConfigMap the server container reads its environment from."""
    (source,) = _server(objs)["envFrom"]
    return objs[("ConfigMap", source["configMapRef"]["name"])]["data"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_objects_rendered(overlay: str, manifests: dict[str, Objects]) -> None:
    kinds = sorted(kind for kind, _ in manifests[overlay])
    expected = ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                "Service", "Service", "ServiceAccount"]
    if overlay != "cpu-model-image":  # that option replaces the claim with an emptyDir
        expected.append("PersistentVolumeClaim")
    assert kinds == sorted(expected)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_are_native_grpc_on_50051(overlay: str, manifests: dict[str, Objects]) -> None:
    server = _server(manifests[overlay])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        spec = server[probe]
        assert spec["grpc"] == {"port": 50051}, probe
        assert not {"httpGet", "tcpSocket", "exec"} & spec.keys(), probe
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 300  # 5 min to load


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_config_parses_with_the_servers_parser(overlay: str,
                                               manifests: dict[str, Objects]) -> None:
    """Every EMBED_* key is a real flag, and the values parse to what the pod spec exposes."""
    objs = manifests[overlay]
    data = _config(objs)
    known = {"EMBED_" + f.name.upper() for f in fields(ServerConfig)}
    assert {k for k in data if k.startswith("EMBED_")} <= known
    config = parse_config([], environ=data)
    server = _server(objs)
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9464}
    assert (config.host, config.grpc_port, config.metrics_port) == ("0.0.0.0", 50051, 9464)
    mounts = {m["name"]: m for m in server["volumeMounts"]}
    assert config.model_repository == Path(mounts["models"]["mountPath"]) == Path("/models")
    assert mounts["models"]["readOnly"] is True
    assert config.poll_seconds == 10.0


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_termination_grace_exceeds_shutdown_grace(overlay: str,
                                                  manifests: dict[str, Objects]) -> None:
    objs = manifests[overlay]
    pod_grace = _pod(objs)["spec"]["terminationGracePeriodSeconds"]
    drain = parse_config([], environ=_config(objs)).shutdown_grace_seconds
    assert (pod_grace, drain) == (30, 20.0)
    assert pod_grace > drain
    assert "lifecycle" not in _server(objs)  # no preStop: SIGTERM handling drains


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_containers_run_non_root_read_only(overlay: str, manifests: dict[str, Objects]) -> None:
    spec = _pod(manifests[overlay])["spec"]
    pod_sc = spec["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    assert (pod_sc["runAsUser"], pod_sc["runAsGroup"]) == (10001, 10001)
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == NAME
    for container in spec["containers"] + spec.get("initContainers", []):
        sc = container["securityContext"]
        assert sc["runAsNonRoot"] is True
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert "limits" in container["resources"]
        assert "requests" in container["resources"]


def test_dockerfile_user_matches_run_as_user(manifests: dict[str, Objects]) -> None:
    uid = _pod(manifests["cpu"])["spec"]["securityContext"]["runAsUser"]
    for name in ("Dockerfile", "Dockerfile.cuda"):
        assert f"USER {uid}:{uid}\n" in (DEPLOY / "docker" / name).read_text()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_pdb_hpa_select_the_pods(overlay: str, manifests: dict[str, Objects]) -> None:
    objs = manifests[overlay]
    labels = _pod(objs)["metadata"]["labels"]
    svc = objs[("Service", NAME)]["spec"]
    assert [(p["name"], p["port"], p.get("appProtocol")) for p in svc["ports"]] == [
        ("grpc", 50051, "grpc"), ("metrics", 9464, "http")]
    headless = objs[("Service", f"{NAME}-headless")]["spec"]
    assert headless["clusterIP"] == "None"
    for selector in (svc["selector"], headless["selector"],
                     objs[("PodDisruptionBudget", NAME)]["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    assert objs[("PodDisruptionBudget", NAME)]["spec"]["maxUnavailable"] == 1
    hpa = objs[("HorizontalPodAutoscaler", NAME)]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": NAME}
    assert hpa["metrics"][0]["resource"]["name"] == "cpu"
    assert "replicas" not in objs[("Deployment", NAME)]["spec"]  # the HPA owns the count


def test_gpu_overlay(manifests: dict[str, Objects]) -> None:
    objs = manifests["gpu"]
    server = _server(objs)
    assert server["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert parse_config([], environ=_config(objs)).device == "cuda"
    assert server["image"] == "embedding-service:0.1.0-cuda"
    spec = _pod(objs)["spec"]
    gpu_taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert gpu_taint in spec["tolerations"]
    assert objs[("HorizontalPodAutoscaler", NAME)]["spec"]["minReplicas"] == 1


@pytest.mark.parametrize("overlay", ["cpu", "cpu-model-image"])
def test_cpu_overlays_ask_for_no_gpu(overlay: str, manifests: dict[str, Objects]) -> None:
    objs = manifests[overlay]
    server = _server(objs)
    assert "nvidia.com/gpu" not in server["resources"]["limits"]
    assert parse_config([], environ=_config(objs)).device == "cpu"
    assert server["image"] == "embedding-service:0.1.0-cpu"
    assert "tolerations" not in _pod(objs)["spec"]
    assert objs[("HorizontalPodAutoscaler", NAME)]["spec"]["minReplicas"] == 2


def test_model_repository_volume_options(manifests: dict[str, Objects]) -> None:
    shared = manifests["cpu"]
    (models,) = [v for v in _pod(shared)["spec"]["volumes"] if v["name"] == "models"]
    assert models["persistentVolumeClaim"] == {"claimName": "embedding-models", "readOnly": True}
    assert shared[("PersistentVolumeClaim", "embedding-models")]["spec"]["accessModes"] == [
        "ReadWriteMany"]
    baked = manifests["cpu-model-image"]
    spec = _pod(baked)["spec"]
    (models,) = [v for v in spec["volumes"] if v["name"] == "models"]
    assert set(models) == {"name", "emptyDir"}
    (init,) = spec["initContainers"]
    assert init["image"] == "embedding-models:1"
    assert init["command"] == ["cp", "-a", "/models/.", "/target/"]
    assert init["volumeMounts"] == [{"name": "models", "mountPath": "/target"}]


def test_pytorchjob_writes_to_the_servers_claim() -> None:
    job = yaml.safe_load((DEPLOY / "k8s" / "training" / "pytorchjob.yaml").read_text())
    assert job["spec"]["elasticPolicy"]["rdzvBackend"] == "c10d"
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    (container,) = worker["containers"]
    assert container["name"] == "pytorch"  # the operator looks for this name
    assert container["command"] == ["/app/.venv/bin/torchrun"]
    assert container["args"][:4] == ["-m", "training", "--model-repository", "/models"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["models"] == "/models"
    (models,) = [v for v in worker["volumes"] if v["name"] == "models"]
    assert models["persistentVolumeClaim"]["claimName"] == "embedding-models"
    assert "readOnly" not in models["persistentVolumeClaim"]
