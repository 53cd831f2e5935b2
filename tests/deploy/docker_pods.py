"""A rendered pod's container, started on a Docker engine as the kubelet would start it.

:func:`run_argv` turns a :class:`tests.deploy.pod_specs.Container` into ``docker run``: the
manifest's image (mapped to the image under test), command (or the image's entrypoint) and
args, env, user and group (plus ``fsGroup`` as a supplementary group), read-only root
filesystem, emptyDirs as tmpfs (a per-pod volume when the pod's containers share one, as an
emptyDir is shared), the claim as one named volume (read-only where the manifest says),
``/dev/shm`` sized to its emptyDir, dropped capabilities, no privilege escalation, CPU and
memory limits (capped at what this machine has). :class:`Prober` runs the container's
startup, readiness and liveness probes as the kubelet does: same kind, path, port, period,
timeout and thresholds; liveness only after startup succeeded; ``failureThreshold``
liveness failures restart the container.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from tests.deploy.pod_specs import Container
from tests.deploy.served import serving

__all__ = ["Pod", "Prober", "docker", "quantity", "run_argv"]

_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6,
          "G": 10**9}


def docker(*args: str, check: bool = True, timeout: float = 120) -> str:
    """Run the docker CLI; its stdout, or RuntimeError with its stderr."""
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:4])} ...: rc {proc.returncode}: "
                           f"{proc.stderr.strip()[-600:]}")
    return proc.stdout


def quantity(text: str | int) -> float:
    """A Kubernetes quantity: "2Gi" -> bytes, "500m" -> 0.5, "2" -> 2."""
    m = re.fullmatch(r"([0-9.]+)(m|Ki|Mi|Gi|Ti|k|M|G)?", str(text))
    if m is None:
        raise ValueError(f"not a quantity: {text!r}")
    value, unit = float(m.group(1)), m.group(2)
    return value / 1000 if unit == "m" else value * _UNITS.get(unit or "", 1)


@dataclass
class Pod:
    """Where a pod's containers run: its name (and hostname), network, claim volume."""

    name: str
    network: str
    claim_volume: str
    label: str
    shared: dict[str, str] = field(default_factory=dict)  # emptyDir name -> docker volume


def _shared_empty_dirs(pod: dict[str, Any]) -> set[str]:
    users: dict[str, int] = {}
    for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
        for m in c.get("volumeMounts", []):
            users[m["name"]] = users.get(m["name"], 0) + 1
    return {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v
            and users.get(v["name"], 0) > 1}


def run_argv(c: Container, pod: Pod, image: str, extra_env: dict[str, str] | None = None,
             restart: str = "no") -> list[str]:
    """``docker run`` arguments that start container ``c`` of ``pod`` as its manifest says."""
    argv = ["run", "-d", "--name", f"{pod.name}-{c.name}", "--hostname", pod.name,
            "--network", pod.network, "--network-alias", pod.name, "--label", pod.label,
            "--restart", restart]
    uid, gid = c.user
    if uid is not None:
        argv += ["--user", f"{uid}:{gid if gid is not None else uid}"]
    fs_group = c.pod.get("securityContext", {}).get("fsGroup")
    if fs_group is not None:
        argv += ["--group-add", str(fs_group)]
    sec = c.spec.get("securityContext", {})
    if c.read_only_root:
        argv.append("--read-only")
    if sec.get("allowPrivilegeEscalation") is False:
        argv += ["--security-opt", "no-new-privileges"]
    for cap in sec.get("capabilities", {}).get("drop", []):
        argv += ["--cap-drop", cap]
    shared = _shared_empty_dirs(c.pod)
    for m in c.mounts:
        if m.kind in ("persistentVolumeClaim", "storageInitializer"):
            # KServe's storage initializer would fill /mnt/models from storageUri; here the
            # claim itself is that repository, read-only.
            ro = ",readonly" if m.read_only else ""
            # volume-nocopy: a kubelet never copies the image's files into a volume.
            argv += ["--mount", f"type=volume,src={pod.claim_volume},dst={m.path},"
                                f"volume-nocopy{ro}"]
        elif m.kind == "emptyDir" and m.path == "/dev/shm":
            argv += ["--shm-size", str(int(quantity(m.source.get("sizeLimit", "64Mi"))))]
        elif m.kind == "emptyDir" and m.volume in shared:
            if m.volume not in pod.shared:
                vol = f"{pod.name}-{m.volume}-{os.getpid()}"
                docker("volume", "create", "--label", pod.label, vol)
                # The kubelet makes an emptyDir world-writable (0777).
                docker("run", "--rm", "--network", "none", "--user", "0",
                       "--mount", f"type=volume,src={vol},dst=/v,volume-nocopy",
                       "--entrypoint", "chmod",
                       image, "0777", "/v")
                pod.shared[m.volume] = vol
            ro = ",readonly" if m.read_only else ""
            argv += ["--mount", f"type=volume,src={pod.shared[m.volume]},dst={m.path},"
                                f"volume-nocopy{ro}"]
        elif m.kind == "emptyDir":
            size = int(quantity(m.source.get("sizeLimit", "1Gi")))
            argv += ["--tmpfs", f"{m.path}:rw,size={size},mode=1777"]
        else:
            raise ValueError(f"{c.where}: volume {m.volume} ({m.kind}) is not run here")
    limits = c.spec.get("resources", {}).get("limits", {})
    if "cpu" in limits:
        argv += ["--cpus", f"{min(quantity(limits['cpu']), float(os.cpu_count() or 1)):g}"]
    if "memory" in limits:
        argv += ["--memory", str(int(quantity(limits["memory"])))]
    for k, v in {**c.env, **(extra_env or {})}.items():
        argv += ["-e", f"{k}={v}"]
    if c.spec.get("command"):
        argv += ["--entrypoint", c.argv[0], image, *c.argv[1:]]
    else:  # the image's own entrypoint, the manifest's args
        argv += [image, *c.argv[1:]]
    return argv


@dataclass
class ProbeLog:
    """What the prober saw: transitions and restarts, with times since start."""

    started_at: float | None = None  # startup probe succeeded
    ready_at: float | None = None  # first readiness success
    ready: bool = False
    restarts: int = 0
    failures: dict[str, int] = field(default_factory=dict)


class Prober:
    """The kubelet's probe loop for one container, against its address on the network."""

    def __init__(self, c: Container, container: str, address: str) -> None:
        self.c, self.container, self.address = c, container, address
        self.log = ProbeLog()
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _port(self, port: int | str) -> int:
        if isinstance(port, int):
            return port
        (p,) = [p["containerPort"] for p in self.c.spec["ports"] if p["name"] == port]
        return int(p)

    def check(self, probe: dict[str, Any]) -> bool:
        """One probe, as the kubelet runs it: success or failure within timeoutSeconds."""
        timeout = float(probe.get("timeoutSeconds", 1))
        if "grpc" in probe:
            target = f"{self.address}:{self._port(probe['grpc']['port'])}"
            return serving(target, probe["grpc"].get("service", ""), timeout)
        if "httpGet" in probe:
            get = probe["httpGet"]
            url = f"http://{self.address}:{self._port(get['port'])}{get.get('path', '/')}"
            try:
                with urllib.request.urlopen(url, timeout=timeout) as r:
                    return 200 <= r.status < 400
            except (urllib.error.URLError, OSError):
                return False
        raise ValueError(f"{self.c.where}: probe kind {sorted(probe)} not run here")

    def _loop(self, kind: str, probe: dict[str, Any]) -> None:
        period = float(probe.get("periodSeconds", 10))
        threshold = int(probe.get("failureThreshold", 3))
        success = int(probe.get("successThreshold", 1))
        fails = oks = 0
        if kind != "startup":  # readiness and liveness start once startup has succeeded
            while self.log.started_at is None and not self._stop.wait(0.2):
                pass
        while not self._stop.wait(period if kind != "startup" or fails or oks else 0):
            ok = self.check(probe)
            fails, oks = (0, oks + 1) if ok else (fails + 1, 0)
            now = time.monotonic() - self.t0
            if not ok:
                self.log.failures[kind] = self.log.failures.get(kind, 0) + 1
            if kind == "startup":
                if oks >= success:
                    self.log.started_at = now
                    return
                if fails >= threshold:
                    self._restart()
                    fails = 0
            elif kind == "readiness":
                if ok and oks >= success and not self.log.ready:
                    self.log.ready = True
                    self.log.ready_at = self.log.ready_at or now
                elif not ok and fails >= threshold:
                    self.log.ready = False
            elif kind == "liveness" and fails >= threshold:
                self._restart()
                fails = 0

    def _restart(self) -> None:
        self.log.restarts += 1
        docker("restart", "-t", str(self.c.pod.get("terminationGracePeriodSeconds", 30)),
               self.container, check=False)

    def start(self) -> Prober:
        for kind in ("startup", "readiness", "liveness"):
            probe = self.c.spec.get(f"{kind}Probe")
            if probe is None:
                if kind == "startup":
                    self.log.started_at = 0.0
                continue
            t = threading.Thread(target=self._loop, args=(kind, probe), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
