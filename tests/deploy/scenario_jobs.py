"""The scenario's batch workloads: the PyTorchJob's workers and the importer Job, run on Docker.

Each is started from its rendered manifest (tests/deploy/pod_specs.py) by
tests/deploy/docker_pods.py; what the Training Operator and the Job controller would do
around them is done here: the operator's PET_* environment and ``restartPolicy`` (Docker's
restart policy of the same name), one pod name per Worker replica (its hostname and DNS name
on the scenario's network, so ``PET_RDZV_ENDPOINT``'s worker-0 resolves as the operator's
headless Service makes it), init containers run to completion before the main one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tests.deploy.docker_pods import Pod, docker, run_argv
from tests.deploy.pod_specs import Container, containers, operator_env

__all__ = ["JobRun", "logs", "run_import", "run_training"]

_RESTART = {"OnFailure": "on-failure", "Never": "no", "Always": "always", "ExitCode": "no"}


@dataclass
class JobRun:
    """What happened: wall time, exit codes, restarts, trainer-state steps seen, logs."""

    seconds: float = 0.0
    exit_codes: dict[str, int] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    steps_seen: list[int] = field(default_factory=list)
    killed_at_step: int | None = None
    logs: dict[str, str] = field(default_factory=dict)


def _state_step(path: Path) -> int | None:
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True)["step"])
    except (OSError, RuntimeError, EOFError, KeyError):
        return None  # not written yet, or being replaced


def _wait_exit(names: list[str], deadline_s: float, run: JobRun,
               tick: Callable[[], None]) -> None:
    t0 = time.monotonic()
    left = set(names)
    while left:
        if time.monotonic() - t0 > deadline_s:
            raise TimeoutError(f"{sorted(left)} still running after {deadline_s:.0f} s")
        tick()
        for name in sorted(left):
            state = json.loads(docker("inspect", "--format", "{{json .State}}", name))
            restarting = state["Restarting"] or (state["ExitCode"] != 0 and json.loads(
                docker("inspect", "--format", "{{json .HostConfig.RestartPolicy}}", name)
            )["Name"] == "on-failure")
            if not state["Running"] and not restarting:
                left.discard(name)
                run.exit_codes[name] = int(state["ExitCode"])
        time.sleep(1)


def run_training(objs: list[dict[str, Any]], image: str, network: str, claim: str,
                 label: str, claim_root: Path, overrides: dict[str, str],
                 kill_worker_at_step: int | None, deadline_s: float = 900) -> JobRun:
    """Run the PyTorchJob's Worker replicas to completion; SIGKILL worker 1's pod (its
    torchrun agent, PID 1) once the shared trainer state reaches ``kill_worker_at_step``."""
    (job,) = [o for o in objs if o["kind"] == "PyTorchJob"]
    (worker,) = [c for c in containers("training", objs) if c.role == "Worker"]
    spec = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    restart = _RESTART[spec.get("restartPolicy", "OnFailure")]
    extra = {**operator_env(job), **overrides}
    state = claim_root / ".training" / "runs" / "trained" / "state" / "trainer.pt"
    run, names = JobRun(), []
    t0 = time.monotonic()
    for i in range(int(spec["replicas"])):
        pod = Pod(f"{job['metadata']['name']}-worker-{i}", network, claim, label)
        docker(*run_argv(worker, pod, image, extra, restart=restart))
        names.append(f"{pod.name}-{worker.name}")

    def tick() -> None:
        step = _state_step(state)
        if step is not None and (not run.steps_seen or run.steps_seen[-1] != step):
            run.steps_seen.append(step)
        if (kill_worker_at_step is not None and run.killed_at_step is None
                and step is not None and step >= kill_worker_at_step):
            pid = int(docker("inspect", "--format", "{{.State.Pid}}", names[1]).strip())
            os.kill(pid, signal.SIGKILL)  # the pod's PID 1 dies: exit 137, restartPolicy
            run.killed_at_step = step

    _wait_exit(names, deadline_s, run, tick)
    run.seconds = time.monotonic() - t0
    for name in names:
        run.restarts[name] = int(docker("inspect", "--format", "{{.RestartCount}}", name))
        run.logs[name] = logs(name)
        docker("rm", "-f", "-v", name, check=False)
    return run


def run_import(objs: list[dict[str, Any]], images: dict[str, str], network: str,
               claim: str, label: str, deadline_s: float = 300) -> JobRun:
    """The importer Job's pod: init containers in order, each to exit 0, then the main one."""
    (job,) = [o for o in objs if o["kind"] == "Job"]
    pod = Pod(job["metadata"]["name"], network, claim, label)
    run = JobRun()
    t0 = time.monotonic()
    found = containers("import", objs)
    for c in sorted(found, key=lambda c: not c.init):
        name = f"{pod.name}-{c.name}"
        docker(*run_argv(c, pod, _image(c, images)))
        _wait_exit([name], deadline_s, run, lambda: None)
        run.logs[name] = logs(name)
        if run.exit_codes[name] != 0:
            break
    run.seconds = time.monotonic() - t0
    for c in found:
        docker("rm", "-f", "-v", f"{pod.name}-{c.name}", check=False)
    for vol in pod.shared.values():
        docker("volume", "rm", "-f", vol, check=False)
    return run


def logs(name: str, tail: int = 4000) -> str:
    """A container's stdout and stderr, interleaved, the last ``tail`` characters."""
    proc = subprocess.run(["docker", "logs", name], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60)
    return proc.stdout[-tail:]


def _image(c: Container, images: dict[str, str]) -> str:
    repo = "embedding-service" if c.ours else c.image.rsplit("/", 1)[-1].split(":", 1)[0]
    return images[repo]
