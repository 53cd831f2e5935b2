"""The scenario's checks against the server replicas, the importer's source and KServe.

Used by tests/deploy/k8s_scenario.py: what the replicas serve (version, bytes, agreement
between replicas), how long a rollout takes to reach all of them, the probes' view of an
empty repository, the training job's outcome, the importer's checkpoint image (a tiny
Hugging Face GPT-2 written by ``transformers``, the oracle for what is served), and the
KServe runtime's v2 ModelInfer.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from client import EmbeddingClient, EmbeddingError
from service.format.checkpoint import read_checkpoint
from tests.deploy.docker_pods import Pod, Prober, docker, run_argv
from tests.deploy.image_check import Report
from tests.deploy.pod_specs import containers
from tests.deploy.scenario_jobs import JobRun
from tests.deploy.served import IDS, model_infer, serving

__all__ = ["IDS", "ServedChecks", "hf_source", "kserve_infer"]

GRPC_PORT = 50051  # the Deployment's grpc containerPort
POLL_S = 10  # EMBED_POLL_SECONDS in the base ConfigMap: a rollout reaches a pod within one


class ServedChecks:
    """What the replicas serve, checked and timed."""

    def __init__(self, report: Report, ips: list[str], probers: list[Prober]) -> None:
        self.report, self.ips, self.probers = report, ips, probers
        self.bytes: dict[tuple[str, int], bytes] = {}

    def embed(self, ip: str, model: str) -> tuple[int, bytes]:
        with EmbeddingClient(f"{ip}:{GRPC_PORT}") as client:
            e = client.embed(ids=IDS, model=model, timeout=10)
        return e.version, e.array.tobytes()

    def _wait_all(self, model: str, version: int, deadline_s: float) -> list[bytes]:
        t0 = time.monotonic()
        last: list[Any] = []
        while time.monotonic() - t0 < deadline_s:
            last = []
            for ip in self.ips:
                try:
                    last.append(self.embed(ip, model))
                except EmbeddingError as e:  # not loaded yet (UNAVAILABLE, NOT_FOUND)
                    last.append((None, e.code.name))
            if all(v == version for v, _ in last):
                return [b for _, b in last]
            time.sleep(0.5)
        seen = [(v, b if v is None else "...") for v, b in last]
        raise TimeoutError(f"{model} version {version} not served by every replica in "
                           f"{deadline_s:.0f} s: {seen}")

    def empty_repository(self, names: list[str], seconds: float) -> None:
        """The claim is empty: each replica is live (startup passed), not ready, not restarted."""
        t0 = time.monotonic()  # the startup probe's own budget, then ``seconds`` of probing
        budget = max(float(p.c.spec["startupProbe"]["periodSeconds"])
                     * int(p.c.spec["startupProbe"]["failureThreshold"]) for p in self.probers)
        while (any(p.log.started_at is None for p in self.probers)
               and time.monotonic() - t0 < budget):
            time.sleep(0.5)
        time.sleep(seconds)
        for name, p in zip(names, self.probers, strict=True):
            log = p.log
            self.report.check(
                f"{name} on the empty claim: live, not ready, not restarted",
                log.started_at is not None and not log.ready and log.restarts == 0
                and log.failures.get("readiness", 0) > 0 and "liveness" not in log.failures,
                f"startup probe passed at {log.started_at}s, readiness failures "
                f"{log.failures.get('readiness', 0)}, liveness failures "
                f"{log.failures.get('liveness', 0)}, restarts {log.restarts} "
                f"{seconds} s after it")
        if self.probers[0].log.started_at is not None:
            self.report.figures["live_on_empty_claim_s"] = round(self.probers[0].log.started_at, 1)

    def training_ran(self, title: str, run: JobRun, version_dir: Path, killed: bool) -> None:
        ok = set(run.exit_codes.values()) == {0}
        detail = (f"exit codes {run.exit_codes}, restarts {run.restarts}, trainer-state steps "
                  f"seen {run.steps_seen}, killed at {run.killed_at_step}, {run.seconds:.1f} s")
        if not ok:
            detail += " | " + " | ".join(run.logs.values())[-3000:]
        self.report.check(f"{title}: every worker exits 0", ok, detail)
        if killed:
            steps = run.steps_seen
            self.report.check(
                f"{title}: a worker pod killed mid-run, the job resumed (steps never went back)",
                run.killed_at_step is not None and max(run.restarts.values()) >= 1
                and steps == sorted(steps), detail)

        def loads() -> str:
            ckpt = read_checkpoint(version_dir)
            m = ckpt.manifest
            return (f"{version_dir.name}: {m.table_rows}x{m.dim}, step "
                    f"{m.provenance.get('step')}, every file's sha256 checked")
        self.report.attempt(f"{title}: exported version complete, loads", loads)

    def rolls_to(self, title: str, model: str, version: int, since: float, figure: str,
                 exported: Path | None = None) -> None:
        def check() -> str:
            got = self._wait_all(model, version, deadline_s=600)
            seconds = time.monotonic() - since
            assert len(set(got)) == 1, "the replicas answer different bytes"
            self.bytes[(model, version)] = got[0]
            if (model, version - 1) in self.bytes:
                assert got[0] != self.bytes[(model, version - 1)], "same bytes as before"
            self.report.figures[figure] = round(seconds, 1)
            after = ""
            if exported is not None:
                lag = time.time() - exported.stat().st_mtime
                self.report.figures[figure + "_after_export"] = round(lag, 1)
                after = f", {lag:.1f} s after the export (poll {POLL_S} s)"
            # A replica may answer before its next readiness probe has run: one period.
            period = float(self.probers[0].c.spec["readinessProbe"]["periodSeconds"])
            t_ready = time.monotonic()
            while (not all(p.log.ready for p in self.probers)
                   and time.monotonic() - t_ready < 2 * period):
                time.sleep(0.2)
            ready = [p.log.ready for p in self.probers]
            assert all(ready), f"readiness {ready}"
            return (f"{model} version {version} on all {len(got)} replicas, same bytes, all "
                    f"ready, {seconds:.1f} s after the job started{after}")
        self.report.attempt(f"{title}: both replicas serve {model}/{version}", check)

    def rollback(self, image: str, claim: str, model: str, version: int) -> None:
        """docs/deploy.md's rollback: remove the served version's directory."""
        def check() -> str:
            t0 = time.monotonic()
            docker("run", "--rm", "--network", "none", "--user", "10001:10001",
                   "--mount", f"type=volume,src={claim},dst=/models,volume-nocopy",
                   "--entrypoint", "rm",
                   image, "-rf", f"/models/{model}/{version}")
            got = self._wait_all(model, version - 1, deadline_s=3 * POLL_S)
            seconds = time.monotonic() - t0
            assert set(got) == {self.bytes[(model, version - 1)]}, "not version 1's bytes"
            self.report.figures["rollback_s"] = round(seconds, 1)
            return f"{model}/{version - 1} on every replica {seconds:.1f} s after the removal"
        self.report.attempt(f"rollback (remove {model}/{version}): every replica serves "
                            f"{model}/{version - 1} again", check)

    def serves_imported(self, source: Path, since: float) -> None:
        def check() -> str:
            import torch
            from safetensors.torch import load_file

            got = self._wait_all("imported", 1, deadline_s=3 * POLL_S + 60)
            sd = load_file(str(source / "model.safetensors"))
            wte = sd.get("transformer.wte.weight", sd.get("wte.weight"))
            wpe = sd.get("transformer.wpe.weight", sd.get("wpe.weight"))
            want = (wte[torch.tensor(IDS)] + wpe[:len(IDS)]).float().numpy().tobytes()  # (T, C)
            assert set(got) == {want}, "not transformers' wte[ids] + wpe[0:T]"
            seconds = time.monotonic() - since
            self.report.figures["import_to_served_s"] = round(seconds, 1)
            return (f"imported/1 on every replica, bit-exact against the checkpoint's own "
                    f"tables, {seconds:.1f} s after the Job started")
        self.report.attempt("imported model served by both replicas", check)


def hf_source(image: str, label: str, work: Path) -> str:
    """A checkpoint image as deploy/k8s/import expects: a tiny GPT-2 at /source."""
    from transformers import GPT2Config, GPT2LMHeadModel

    ctx = work / "hf-source"
    (ctx / "source").mkdir(parents=True)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=64, vocab_size=50257)
    GPT2LMHeadModel(config).save_pretrained(str(ctx / "source"), safe_serialization=True)
    # safetensors writes its files 0600 and COPY keeps modes: the init container runs as
    # uid 10001, so the image's files must be world-readable (docs/deploy.md says so).
    for path in (ctx / "source").rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (ctx / "Dockerfile").write_text(f"FROM {image}\nCOPY source /source\n")
    tag = f"embedding-source:scenario-{label.rsplit('=', 1)[-1]}"
    os.environ["DOCKER_BUILDKIT"] = "0"  # Debian's docker.io has no buildx
    docker("build", "--network", "none", "--label", label, "-t", tag, str(ctx), timeout=600)
    return tag


def kserve_infer(objs: list[dict[str, Any]], image: str, network: str, claim: str,
                 label: str, served: ServedChecks, root: Path) -> str:
    """Start the gRPC ServingRuntime's container as written; ModelInfer on the model its
    --default-model names, placed as KServe's storage initializer would (trained/1)."""
    (c,) = [c for c in containers("kserve", objs) if c.owner_name == "embedding-service-grpc"]
    args = list(c.spec["args"])
    model = args[args.index("--default-model") + 1]
    # The InferenceService's storageUri holds that model; the claim stands in for it, so
    # the model is put there under the runtime's name (the server refuses a default model
    # its repository does not hold).
    source, placed = root / "trained" / "1", root / model / "1"
    shutil.copytree(source, placed)
    owner = source.stat()
    for path in [placed.parent, placed, *placed.rglob("*")]:
        os.chown(path, owner.st_uid, owner.st_gid)  # the job's files, as the job wrote them
    pod = Pod("embedding-predictor", network, claim, label)
    docker(*run_argv(c, pod, image))
    name = f"{pod.name}-{c.name}"
    fmt = "{{(index .NetworkSettings.Networks \"" + network + "\").IPAddress}}"
    ip = docker("inspect", "--format", fmt, name).strip()
    (port,) = [p["containerPort"] for p in c.spec["ports"]]
    target = f"{ip}:{port}"
    t0 = time.monotonic()
    _until(lambda: serving(target), 120, f"{target} not SERVING")
    resp = model_infer(target, model)
    want = served.bytes[("trained", 1)]
    assert resp.raw_output_contents[0] == want, "not the Deployment's bytes for trained/1"
    out = resp.outputs[0]
    return (f"{' '.join(c.spec['args'])}: SERVING in {time.monotonic() - t0:.1f} s; "
            f"ModelInfer {model} (trained/1) -> {out.datatype} {list(out.shape)}, the "
            f"replicas' bytes")


def _until(fn: Callable[[], bool], deadline_s: float, what: str) -> None:
    t0 = time.monotonic()
    while not fn():
        if time.monotonic() - t0 > deadline_s:
            raise TimeoutError(what)
        time.sleep(0.5)
