"""One user everywhere: the Dockerfiles' USER, the user they create, and every pod that runs
the image (server Deployment of each overlay, the training PyTorchJob, the KServe runtime)
run as the same uid/gid, and the pods that mount the model volume set fsGroup to that gid.
So what the training job writes (files 0644, directories 0755: service.format.checkpoint)
is served by the Deployment without a chmod, whoever wrote it."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from service.format.writer import DIR_MODE, FILE_MODE
from tests.deploy.conftest import DEPLOY, OVERLAYS

DOCKERFILES = ("Dockerfile", "Dockerfile.cuda")


def _image_user(name: str) -> tuple[int, int]:
    """(uid, gid) of the Dockerfile's USER, checked against the user and group it creates."""
    text = (DEPLOY / "docker" / name).read_text()
    ((uid, gid),) = re.findall(r"^USER (\d+):(\d+)$", text, re.M)
    assert re.search(rf"groupadd --system --gid {gid} embed", text), name
    assert re.search(rf"useradd --system --uid {uid} --gid {gid} ", text), name
    return int(uid), int(gid)


def _effective(pod_spec: dict[str, Any], container: dict[str, Any]) -> tuple[Any, Any]:
    """The (uid, gid) a container runs as: its own securityContext over the pod's."""
    pod = pod_spec.get("securityContext", {})
    own = container.get("securityContext", {})
    return (own.get("runAsUser", pod.get("runAsUser")),
            own.get("runAsGroup", pod.get("runAsGroup")))


@pytest.fixture(scope="module")
def image_user() -> tuple[int, int]:
    users = {name: _image_user(name) for name in DOCKERFILES}
    assert len(set(users.values())) == 1, users
    uid, gid = users["Dockerfile"]
    assert uid != 0
    assert gid != 0
    return uid, gid


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_server_pods_run_as_the_image_user(overlay: str, image_user: tuple[int, int],
                                           manifests: dict[str, Any]) -> None:
    spec = manifests[overlay][("Deployment", "embedding-service")]["spec"]["template"]["spec"]
    assert spec["securityContext"]["fsGroup"] == image_user[1]
    for container in spec["containers"] + spec.get("initContainers", []):
        assert _effective(spec, container) == image_user, (overlay, container["name"])


def test_training_job_writes_as_the_server_reads(image_user: tuple[int, int],
                                                 manifests: dict[str, Any]) -> None:
    job = yaml.safe_load((DEPLOY / "k8s" / "training" / "pytorchjob.yaml").read_text())
    spec = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    server = manifests["cpu"][("Deployment", "embedding-service")]["spec"]["template"]["spec"]
    assert spec["securityContext"]["fsGroup"] == server["securityContext"]["fsGroup"]
    for container in spec["containers"]:
        assert _effective(spec, container) == image_user, container["name"]
    # Same claim, read-write in the job, read-only in the servers.
    (claim,) = [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]
                if "persistentVolumeClaim" in v]
    (served,) = [v["persistentVolumeClaim"]["claimName"] for v in server["volumes"]
                 if "persistentVolumeClaim" in v]
    assert claim == served
    # And what it writes is readable by any uid anyway (tests/training/test_version_modes.py).
    assert (FILE_MODE, DIR_MODE) == (0o644, 0o755)


def test_kserve_runtime_runs_as_the_image_user(image_user: tuple[int, int]) -> None:
    runtime = yaml.safe_load((DEPLOY / "kserve" / "servingruntime.yaml").read_text())
    for container in runtime["spec"]["containers"]:
        assert _effective({}, container) == image_user, container["name"]
