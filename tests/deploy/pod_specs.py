"""What the rendered manifests ask a container runtime to run, read the way the kubelet reads it.

One place that renders every kustomization (the server overlays, the training job, the
importer Job, the KServe recipe) and turns each container into a :class:`Container`: the
program it starts (the image's entrypoint when the manifest gives no ``command``), its args
with ``$(VAR)`` expanded as Kubernetes expands them, its environment (``env`` and
``envFrom``, ConfigMap and Secret references resolved from the rendered objects), user,
filesystem, mounts, resources and probes. ``test_deploy_commands.py`` parses those with the
project's real parsers; ``k8s_scenario.py`` starts them on a Docker engine. Neither keeps a
second copy of any manifest.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["IMAGE_ENTRYPOINT", "IMAGE_WORKDIR", "KUSTOMIZATIONS", "OPERATOR_RDZV_PORT",
           "Container", "Mount", "containers", "expand", "operator_env", "render"]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
# Every kustomization an operator applies (docs/deploy.md), by the name tests report.
KUSTOMIZATIONS = {
    **{f"overlays/{o}": DEPLOY / "k8s" / "overlays" / o
       for o in ("cpu", "gpu", "cpu-model-image", "cpu-network-policy",
                 "cpu-prometheus-operator", "shm-sidecar", "cpu-exposed")},
    "training": DEPLOY / "k8s" / "training",
    "import": DEPLOY / "k8s" / "import",
    "kserve": DEPLOY / "kserve",
}
# deploy/docker/Dockerfile's ENTRYPOINT and WORKDIR (a test checks they still say so).
IMAGE_ENTRYPOINT = ("/app/scripts/serve.sh",)
IMAGE_WORKDIR = "/app"
# The Kubeflow Training Operator's default port for a PyTorchJob's rendezvous/master.
OPERATOR_RDZV_PORT = 23456
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)|\$\$")


@dataclass(frozen=True)
class Mount:
    """One volumeMount, with what backs it."""

    path: str
    volume: str
    read_only: bool
    kind: str  # persistentVolumeClaim | emptyDir | secret | configMap | ...
    source: dict[str, Any]


@dataclass
class Container:
    """One container as the kubelet would start it."""

    where: str  # "<kustomization> <Kind>/<name> <role> container <name>"
    owner_kind: str
    owner_name: str
    role: str  # Deployment, Worker, Job, ServingRuntime
    spec: dict[str, Any]
    pod: dict[str, Any]
    init: bool
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def image(self) -> str:
        return str(self.spec["image"])

    @property
    def ours(self) -> bool:
        """Runs the project's image (embedding-service, any registry and tag)."""
        repo = self.image.rsplit(":", 1)[0] if ":" in self.image.rsplit("/", 1)[-1] \
            else self.image
        return repo.rsplit("/", 1)[-1] == "embedding-service"

    @property
    def argv(self) -> list[str]:
        """Command then args, ``$(VAR)`` expanded; the image's entrypoint when no command."""
        command = self.spec.get("command")
        args = [expand(a, self.env) for a in self.spec.get("args", [])]
        if command is None:
            if not self.ours:
                raise ValueError(f"{self.where}: no command, and the image is not ours")
            return [*IMAGE_ENTRYPOINT, *args]
        return [*(expand(c, self.env) for c in command), *args]

    @property
    def read_only_root(self) -> bool:
        return bool(self._security("readOnlyRootFilesystem"))

    @property
    def user(self) -> tuple[int | None, int | None]:
        return self._security("runAsUser"), self._security("runAsGroup")

    def _security(self, key: str) -> Any:
        own = self.spec.get("securityContext", {})
        return own[key] if key in own else self.pod.get("securityContext", {}).get(key)

    def mount_of(self, path: str) -> Mount | None:
        """The mount ``path`` lies in (the deepest one), or None: the image's filesystem."""
        best: Mount | None = None
        for m in self.mounts:
            root = m.path.rstrip("/") or "/"
            inside = path == root or path.startswith(root + "/")
            if inside and (best is None or len(root) > len(best.path)):
                best = m
        return best

    def writable(self, path: str) -> bool:
        """Can this container create files under ``path`` (absolute)?"""
        m = self.mount_of(path)
        if m is None:
            return not self.read_only_root
        return not m.read_only


def render(kubectl: str, name: str) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of one of :data:`KUSTOMIZATIONS`, as objects."""
    proc = subprocess.run([kubectl, "kustomize", str(KUSTOMIZATIONS[name])],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {name}: {proc.stderr.strip()}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names expand, others stay, ``$$`` is ``$``."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR.sub(one, text)


def operator_env(job: dict[str, Any]) -> dict[str, str]:
    """What the Training Operator adds to every Worker of an elastic PyTorchJob.

    PET_* are torchrun's own defaults (``--nnodes`` from PET_NNODES ...): the operator turns
    ``elasticPolicy`` into them, and points the rendezvous at worker 0.
    """
    policy = job["spec"]["elasticPolicy"]
    name = job["metadata"]["name"]
    return {
        "PET_NNODES": f"{policy['minReplicas']}:{policy['maxReplicas']}",
        "PET_NPROC_PER_NODE": str(policy.get("nProcPerNode", 1)),
        "PET_RDZV_BACKEND": policy["rdzvBackend"],
        "PET_RDZV_ENDPOINT": f"{name}-worker-0:{OPERATOR_RDZV_PORT}",
        "PET_MAX_RESTARTS": str(policy["maxRestarts"]),
        "PYTHONUNBUFFERED": "1",
    }


def _pods(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    kind, spec = obj["kind"], obj.get("spec", {})
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return [(kind, spec["template"]["spec"])]
    if kind == "PyTorchJob":
        return [(role, r["template"]["spec"])
                for role, r in spec["pytorchReplicaSpecs"].items()]
    if kind == "ServingRuntime":  # KServe puts these containers in the predictor's pod
        return [("ServingRuntime", {"containers": spec["containers"],
                                    "volumes": spec.get("volumes", [])})]
    return []


def _value_from(ref: dict[str, Any], objects: dict[tuple[str, str], dict[str, Any]],
                where: str) -> str:
    if "configMapKeyRef" in ref:
        r = ref["configMapKeyRef"]
        cm = objects.get(("ConfigMap", r["name"]))
        if cm is None or r["key"] not in cm.get("data", {}):
            raise ValueError(f"{where}: configMapKeyRef {r['name']}/{r['key']} not rendered")
        return str(cm["data"][r["key"]])
    if "secretKeyRef" in ref:  # the operator creates the Secret: a stand-in value
        r = ref["secretKeyRef"]
        return f"secret-{r['name']}-{r['key']}"
    if "fieldRef" in ref:
        return f"field-{ref['fieldRef']['fieldPath']}"
    raise ValueError(f"{where}: unsupported valueFrom {sorted(ref)}")


def containers(name: str, objs: list[dict[str, Any]]) -> list[Container]:
    """Every container of every pod the kustomization ``name`` renders."""
    by_key = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    out: list[Container] = []
    for obj in objs:
        for role, pod in _pods(obj):
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for init, key in ((True, "initContainers"), (False, "containers")):
                for spec in pod.get(key, []):
                    where = (f"{name} {obj['kind']}/{obj['metadata']['name']} {role} "
                             f"{'initContainer' if init else 'container'} {spec['name']}")
                    c = Container(where, obj["kind"], obj["metadata"]["name"], role, spec,
                                  pod, init)
                    for src in spec.get("envFrom", []):
                        ref = src.get("configMapRef") or src.get("secretRef")
                        cm = by_key.get(("ConfigMap", ref["name"]))
                        if cm is not None:
                            c.env.update({k: str(v) for k, v in cm.get("data", {}).items()})
                    for e in spec.get("env", []):
                        c.env[e["name"]] = (expand(str(e["value"]), c.env) if "value" in e
                                            else _value_from(e["valueFrom"], by_key, where))
                    for m in spec.get("volumeMounts", []):
                        vol = volumes.get(m["name"])
                        if vol is None:
                            raise ValueError(f"{where}: volumeMount {m['name']} has no volume")
                        (kind,) = [k for k in vol if k != "name"]
                        source = vol[kind] or {}
                        ro = bool(m.get("readOnly")) or kind in ("secret", "configMap",
                                                                  "downwardAPI", "projected") \
                            or bool(kind == "persistentVolumeClaim" and source.get("readOnly"))
                        c.mounts.append(Mount(m["mountPath"], m["name"], ro, kind, source))
                    if obj["kind"] == "ServingRuntime" and spec["name"] == "kserve-container":
                        # KServe's storage initializer downloads storageUri into an emptyDir
                        # and mounts it here, read-only, in the container with this name.
                        c.mounts.append(Mount("/mnt/models", "kserve-provision-location", True,
                                              "storageInitializer", {}))
                    out.append(c)
    return out
