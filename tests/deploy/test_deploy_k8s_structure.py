"""Exact structural checks on the rendered overlays, and their config through the real parser."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.config import ServerConfig, parse_config
from tests.deploy.conftest import DEPLOY, OVERLAYS, REPO

Objects = dict[tuple[str, str], dict[str, Any]]
NAME = "embedding-service"


def _pod(objs: Objects) -> dict[str, Any]:
    return objs[("Deployment", NAME)]["spec"]["template"]


def _container(objs: Objects, name: str) -> dict[str, Any]:
    (container,) = [c for c in _pod(objs)["spec"]["containers"] if c["name"] == name]
    return dict(container)


def _server(objs: Objects) -> dict[str, Any]:
    return _container(objs, "server")


def _config(objs: Objects) -> dict[str, str]:
    """The ConfigMap the server container reads its environment from."""
    (source,) = _server(objs)["envFrom"]
    return objs[("ConfigMap", source["configMapRef"]["name"])]["data"]


# The objects each overlay adds to the base's (or, for cpu-model-image, takes away).
_EXTRA_KINDS = {"cpu-network-policy": ["NetworkPolicy"],
                "cpu-prometheus-operator": ["PrometheusRule", "ServiceMonitor"],
                "cpu-exposed": ["Ingress", "Ingress"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_objects_rendered(overlay: str, manifests: dict[str, Objects]) -> None:
    kinds = sorted(kind for kind, _ in manifests[overlay])
    expected = ["ConfigMap", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                "Service", "Service", "ServiceAccount", *_EXTRA_KINDS.get(overlay, [])]
    if overlay != "cpu-model-image":  # that option replaces the claim with an emptyDir
        expected.append("PersistentVolumeClaim")
    assert kinds == sorted(expected)
    containers = [c["name"] for c in _pod(manifests[overlay])["spec"]["containers"]]
    assert containers == (["server", "consumer"] if overlay == "shm-sidecar" else ["server"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_live_over_http_ready_over_native_grpc(overlay: str,
                                                      manifests: dict[str, Objects]) -> None:
    """Startup and liveness: the process answers (an empty repository is never restarted);
    readiness: a model is loaded (the scenario in scripts/image_test.sh runs all three)."""
    server = _server(manifests[overlay])
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    for probe in ("startupProbe", "livenessProbe"):
        spec = server[probe]
        assert spec["httpGet"] == {"path": "/v2/health/live", "port": "http"}, probe
        assert not {"grpc", "tcpSocket", "exec"} & spec.keys(), probe
    assert ports["http"] == 8000
    ready = server["readinessProbe"]
    assert ready["grpc"] == {"port": 50051}
    assert not {"httpGet", "tcpSocket", "exec"} & ready.keys()
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 300  # 5 min to start


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
    assert ports == {"grpc": 50051, "metrics": 9464, "http": 8000}
    assert (config.host, config.grpc_port, config.metrics_port) == ("0.0.0.0", 50051, 9464)
    assert config.http_port == 8000
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
        ("grpc", 50051, "grpc"), ("metrics", 9464, "http"), ("http", 8000, "http")]
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
    args = container["args"]
    assert args[:2] == ["-m", "training"]
    # The flags are parsed by training's own parser in test_deploy_commands.py; here: the
    # export goes to the claim's mount.
    assert args[args.index("--out-repository") + 1] == "/models"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["models"] == "/models"
    (models,) = [v for v in worker["volumes"] if v["name"] == "models"]
    assert models["persistentVolumeClaim"]["claimName"] == "embedding-models"
    assert "readOnly" not in models["persistentVolumeClaim"]


def _port_numbers(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def test_network_policy(manifests: dict[str, Objects]) -> None:
    """gRPC and REST only from labelled client namespaces, metrics only from Prometheus, no
    egress."""
    objs = manifests["cpu-network-policy"]
    spec = objs[("NetworkPolicy", NAME)]["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= _pod(objs)["metadata"]["labels"].items()
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["egress"] == []  # listed in policyTypes with no rule: deny all outbound
    grpc_rule, metrics_rule = spec["ingress"]
    assert grpc_rule == {
        "from": [{"namespaceSelector": {"matchLabels": {"embedding-client": "true"}}}],
        "ports": [{"port": "grpc", "protocol": "TCP"}, {"port": "http", "protocol": "TCP"}]}
    # One peer holding both selectors (AND), not two peers (OR).
    assert metrics_rule == {
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name":
                                                        "monitoring"}},
                  "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
        "ports": [{"port": "metrics", "protocol": "TCP"}]}
    # The named ports are the server's real ports.
    ports = _port_numbers(_server(objs))
    assert (ports["grpc"], ports["metrics"], ports["http"]) == (50051, 9464, 8000)
    # The label the docs tell users to set is the one the policy selects on.
    assert "kubectl label namespace <clients-ns> embedding-client=true" in (
        REPO / "docs" / "deploy.md").read_text()


def test_service_monitor_scrapes_the_metrics_port(manifests: dict[str, Objects]) -> None:
    objs = manifests["cpu-prometheus-operator"]
    spec = objs[("ServiceMonitor", NAME)]["spec"]
    assert spec["endpoints"] == [{"port": "metrics", "path": "/metrics", "scheme": "http",
                                  "interval": "15s", "scrapeTimeout": "10s"}]
    selector = spec["selector"]["matchLabels"]
    matched = [name for (kind, name), obj in objs.items()
               if kind == "Service" and selector.items() <= obj["metadata"]["labels"].items()]
    assert sorted(matched) == [NAME, f"{NAME}-headless"]
    # Only the ClusterIP Service has the "metrics" port: each pod is one target, not two.
    with_metrics = [name for name in matched
                    if "metrics" in [p["name"] for p in objs[("Service", name)]["spec"]["ports"]]]
    assert with_metrics == [NAME]
    assert objs[("Service", NAME)]["spec"]["ports"][1]["targetPort"] == "metrics"
    assert _port_numbers(_server(objs))["metrics"] == 9464


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location(
        "to_prometheusrule", DEPLOY / "prometheus" / "to_prometheusrule.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prometheus_rule_is_generated_from_rules_yml(manifests: dict[str, Objects]) -> None:
    """One hand-maintained copy: the PrometheusRule carries rules.yml's groups, byte for byte
    as the generator writes them."""
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    rendered = manifests["cpu-prometheus-operator"][("PrometheusRule", NAME)]
    assert rendered["spec"] == {"groups": rules["groups"]}
    gen = _generator()
    committed = gen.OUTPUT.read_text()
    assert committed == gen.render(gen.RULES.read_text())
    proc = subprocess.run([sys.executable, str(DEPLOY / "prometheus" / "to_prometheusrule.py"),
                           "--check"], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, "")


def test_a_changed_rule_makes_the_prometheus_rule_stale() -> None:
    """Negative control: editing rules.yml without regenerating is caught."""
    gen = _generator()
    text = gen.RULES.read_text()
    assert text.count("p99_5m > 0.25") == 1
    assert gen.render(text.replace("p99_5m > 0.25", "p99_5m > 0.5")) != gen.OUTPUT.read_text()


# GPT-2 at full length (T=1024, C=768), float32 (4 bytes), 64 requests in flight.
_SHM_EXAMPLE_BYTES = 1024 * 768 * 4 * 64


def _bytes(quantity: str) -> int:
    """A binary-suffixed Kubernetes quantity ("256Mi", "2Gi") in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return int(quantity[:-2]) * units[quantity[-2:]]


def test_shm_sidecar_shares_a_memory_emptydir_at_dev_shm(manifests: dict[str, Objects]) -> None:
    objs = manifests["shm-sidecar"]
    spec = _pod(objs)["spec"]
    (shm,) = [v for v in spec["volumes"] if v["name"] == "shm"]
    assert shm == {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"}}
    # The docs' example sizing (192 MiB) fits, with headroom.
    assert _SHM_EXAMPLE_BYTES == 192 * 2**20
    assert _bytes(shm["emptyDir"]["sizeLimit"]) > _SHM_EXAMPLE_BYTES
    for name in ("server", "consumer"):
        mounts = [m for m in _container(objs, name)["volumeMounts"]
                  if m["mountPath"] == "/dev/shm"]
        assert mounts == [{"name": "shm", "mountPath": "/dev/shm"}], name
    # Same user in both (the pod's 10001): the consumer's region files open in the server.
    for name in ("server", "consumer"):
        assert "runAsUser" not in _container(objs, name)["securityContext"]
    assert spec["securityContext"]["runAsUser"] == 10001
    # tmpfs pages are charged to the writer, the server: its limit grows by the sizeLimit.
    base_limit = _server(manifests["cpu"])["resources"]["limits"]["memory"]
    shm_limit = _server(objs)["resources"]["limits"]["memory"]
    assert (base_limit, shm_limit) == ("2Gi", "2304Mi")
    assert _bytes(shm_limit) == _bytes(base_limit) + _bytes(shm["emptyDir"]["sizeLimit"])


def test_shm_consumer_reaches_the_server_on_localhost(manifests: dict[str, Objects]) -> None:
    objs = manifests["shm-sidecar"]
    consumer = _container(objs, "consumer")
    env = {e["name"]: e["value"] for e in consumer["env"]}
    grpc_port = parse_config([], environ=_config(objs)).grpc_port
    assert grpc_port == _port_numbers(_server(objs))["grpc"] == 50051
    assert env["EMBED_TARGET"] == f"127.0.0.1:{grpc_port}"
    # The placeholder is unmistakably the user's to replace.
    assert consumer["image"] == "your-registry.example/your-shm-consumer:replace-me"
    assert "ports" not in consumer  # it serves nothing; nothing reaches it from outside


def test_exposed_needs_a_token_from_a_secret_and_tls_at_the_ingress(
        manifests: dict[str, Objects]) -> None:
    """Exposed means: bearer token from a Secret, the page off, TLS from a Secret, gRPC and
    REST each routed to their own port, metrics never."""
    objs = manifests["cpu-exposed"]
    server = _server(objs)
    env = {e["name"]: e for e in server["env"]}
    assert env["EMBED_AUTH_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": "embedding-auth", "key": "token"}}
    config = [o for (kind, _), o in objs.items() if kind == "ConfigMap"]
    assert [c["data"]["EMBED_UI"] for c in config] == ["0"]
    grpc_in = objs[("Ingress", "embedding-service-grpc")]
    http_in = objs[("Ingress", "embedding-service-http")]
    assert grpc_in["metadata"]["annotations"][
        "nginx.ingress.kubernetes.io/backend-protocol"] == "GRPC"
    assert "nginx.ingress.kubernetes.io/backend-protocol" not in http_in["metadata"][
        "annotations"]
    ports = []
    for ing in (grpc_in, http_in):
        assert [t["secretName"] for t in ing["spec"]["tls"]] == ["embedding-tls"]
        (rule,) = ing["spec"]["rules"]
        assert rule["host"] in ing["spec"]["tls"][0]["hosts"]
        (path,) = rule["http"]["paths"]
        assert path["backend"]["service"]["name"] == NAME
        ports.append(path["backend"]["service"]["port"]["name"])
    assert ports == ["grpc", "http"]
    assert _port_numbers(server)["grpc"] == 50051


@pytest.mark.parametrize("overlay", ["cpu", "gpu", "cpu-network-policy", "cpu-exposed"])
def test_the_claim_gets_the_storage_class_parameter(overlay: str,
                                                    manifests: dict[str, Objects]) -> None:
    claim = manifests[overlay][("PersistentVolumeClaim", "embedding-models")]
    assert claim["spec"]["storageClassName"] == "nfs-csi"
    # The parameter's ConfigMap is local-config: kustomize never emits it.
    assert ("ConfigMap", "embedding-parameters") not in manifests[overlay]


def test_the_page_is_off_in_every_overlay(manifests: dict[str, Objects]) -> None:
    for overlay, objs in manifests.items():
        (config,) = [o for (kind, _), o in objs.items() if kind == "ConfigMap"]
        assert config["data"]["EMBED_UI"] == "0", overlay
