"""The Kubernetes path, run for real on a Docker engine from the rendered manifests.

    python -m tests.deploy.k8s_scenario IMAGE --label embed-image-test=RUN [--figures F]

Not a pytest module (it needs a Docker engine and the built CPU image): scripts/image_test.sh
runs it after the image checks. No Kubernetes API server runs here, but a pod spec is a
container's command, args, env, user, filesystem, mounts, resources and probes, and
tests/deploy/docker_pods.py starts each container with exactly those from
``kubectl kustomize`` output (overlays/cpu, deploy/k8s/training, deploy/k8s/import,
deploy/kserve): one Docker network the scenario creates (pods reach each other by pod name,
nothing else is reached), one named volume for the claim, probes run as the kubelet runs them.
The steps, each printed with its time, as docs/deploy.md tells an operator:

1. two server replicas of the Deployment start on the EMPTY claim: live (startup and
   liveness pass), not ready, never restarted;
2. the PyTorchJob's 2 elastic workers (c10d rendezvous) train a small config on a corpus
   placed on the claim; worker 1's pod is killed mid-run, the job resumes from the shared
   trainer state (its steps never go back) and exports version 1, complete (it loads);
3. both replicas pick it up by hot reload and answer the same bytes;
4. a second run (more steps, resuming) exports version 2: both roll forward;
5. the rollback docs/deploy.md describes (remove the served version's directory): both
   serve version 1 again within a poll;
6. the importer Job imports a Hugging Face GPT-2 checkpoint shipped as an image; both
   replicas serve it, bit-exact against ``transformers``' own tables;
7. the KServe ServingRuntime's container starts with its args and answers a v2 ModelInfer.

The training job's size is the one thing changed: its EMBED_TRAIN_* shape and schedule
(:data:`SMALL`) are overridden so it fits CI's 2 cores; its CPU and memory limits are capped
at what this machine has.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.deploy.docker_pods import Pod, Prober, docker, run_argv
from tests.deploy.image_check import Report
from tests.deploy.pod_specs import containers, render
from tests.deploy.scenario_checks import ServedChecks, hf_source, kserve_infer
from tests.deploy.scenario_jobs import logs, run_import, run_training

# The training run's size on CI (the manifest's own is GPT-2-small on GPUs).
SMALL = {"EMBED_TRAIN_N_LAYER": "1", "EMBED_TRAIN_N_HEAD": "2", "EMBED_TRAIN_N_EMBD": "32",
         "EMBED_TRAIN_BLOCK_SIZE": "32", "EMBED_TRAIN_BATCH_SIZE": "4",
         "EMBED_TRAIN_MAX_STEPS": "300", "EMBED_TRAIN_WARMUP_STEPS": "10",
         "EMBED_TRAIN_EVAL_EVERY": "100000", "EMBED_TRAIN_EVAL_TOKENS": "2048",
         "EMBED_TRAIN_CHECKPOINT_EVERY": "50"}
KILL_AT_STEP = 100
MORE_STEPS = 400  # the second run: resumes at 300, exports version 2
REPLICAS = 2  # the HorizontalPodAutoscaler's minReplicas
CORPUS_BYTES = 200_000
FS_GROUP = 10001


def _kubectl() -> str:
    local = Path(__file__).resolve().parents[2] / ".tools" / "venv" / "bin" / "kubectl"
    found = str(local) if local.exists() else shutil.which("kubectl")
    if found is None:
        raise SystemExit("kubectl not found: run scripts/install_k8s_tools.sh")
    return found


def _ip(container: str, network: str) -> str:
    fmt = "{{(index .NetworkSettings.Networks \"" + network + "\").IPAddress}}"
    return docker("inspect", "--format", fmt, container).strip()


def _claim(label: str) -> tuple[str, Path]:
    """The claim: a named volume, owned as the kubelet's fsGroup leaves a volume."""
    name = f"embed-scenario-models-{os.getpid()}"
    docker("volume", "create", "--label", label, name)
    root = Path(docker("volume", "inspect", "--format", "{{.Mountpoint}}", name).strip())
    os.chown(root, 0, FS_GROUP)
    os.chmod(root, 0o2775)  # group-writable, setgid: new files keep the group
    return name, root


def _place_corpus(root: Path) -> int:
    """The corpus on the claim where the PyTorchJob's --data reads it."""
    import pydoc_data.topics

    text = "\n\n".join(pydoc_data.topics.topics.values())[:CORPUS_BYTES]
    corpus = root / ".training" / "corpus"
    corpus.mkdir(parents=True)
    (corpus / "topics.txt").write_text(text)
    for p in (root / ".training", corpus, corpus / "topics.txt"):
        os.chown(p, 0, FS_GROUP)
        os.chmod(p, 0o2775 if p.is_dir() else 0o664)
    return len(text)


def scenario(report: Report, image: str, label: str, work: Path) -> None:
    kubectl = _kubectl()
    objs = {name: render(kubectl, name)
            for name in ("overlays/cpu", "training", "import", "kserve")}
    network = f"embed-scenario-{os.getpid()}"
    docker("network", "create", "--label", label, network)
    claim, root = _claim(label)
    (server,) = [c for c in containers("overlays/cpu", objs["overlays/cpu"])
                 if c.name == "server"]
    probers: list[Prober] = []
    try:
        names = []
        for i in range(REPLICAS):
            pod = Pod(f"embedding-service-{i}", network, claim, label)
            docker(*run_argv(server, pod, image, restart="always"))
            names.append(f"{pod.name}-server")
            probers.append(Prober(server, names[-1], _ip(names[-1], network)).start())
        served = ServedChecks(report, [_ip(n, network) for n in names], probers)
        served.empty_repository(names, seconds=25)
        size = _place_corpus(root)
        report.step(f"corpus on the claim: .training/corpus/topics.txt, {size} bytes")
        t_job = time.monotonic()
        first = run_training(objs["training"], image, network, claim, label, root, SMALL,
                             kill_worker_at_step=KILL_AT_STEP)
        served.training_ran("training job (2 workers, one killed)", first, root / "trained" / "1",
                            killed=True)
        served.rolls_to("first served version", "trained", 1, since=t_job,
                        figure="first_served_version_s")
        report.figures["training_job_s"] = round(first.seconds, 1)
        t_job = time.monotonic()
        second = run_training(objs["training"], image, network, claim, label, root,
                              {**SMALL, "EMBED_TRAIN_MAX_STEPS": str(MORE_STEPS)},
                              kill_worker_at_step=None)
        served.training_ran("second training job (resumes at 300)", second,
                            root / "trained" / "2", killed=False)
        served.rolls_to("roll forward", "trained", 2, since=t_job, figure="roll_forward_s",
                        exported=root / "trained" / "2")
        served.rollback(image, claim, "trained", 2)
        images = {"embedding-service": image, "embedding-source": hf_source(image, label, work)}
        t_import = time.monotonic()
        imported = run_import(objs["import"], images, network, claim, label)
        report.check("importer Job exits 0", set(imported.exit_codes.values()) == {0},
                     f"{imported.exit_codes} in {imported.seconds:.1f} s"
                     + ("" if set(imported.exit_codes.values()) == {0}
                        else "; " + " | ".join(imported.logs.values())[-1500:]))
        served.serves_imported(work / "hf-source" / "source", since=t_import)
        report.attempt("KServe ServingRuntime answers a v2 ModelInfer", lambda: kserve_infer(
            objs["kserve"], image, network, claim, label, served, root))
        for p, n in zip(probers, names, strict=True):
            report.check(f"{n}: never restarted by its probes", p.log.restarts == 0,
                         f"restarts {p.log.restarts}, probe failures {p.log.failures}")
    finally:
        for p in probers:
            p.stop()
        for n in [f"embedding-service-{i}-server" for i in range(REPLICAS)]:
            if report.ok is False:
                print(f"--- logs of {n} ---\n{logs(n, 3000)}", flush=True)
        ids = docker("ps", "-aq", "--filter", f"label={label}", check=False).split()
        if ids:
            docker("rm", "-f", "-v", *ids, check=False)
        docker("volume", "rm", "-f", claim, check=False)
        docker("network", "rm", network, check=False)


def main(argv: list[str] | None = None) -> int:
    """Entry point: 0 when every step passed."""
    p = argparse.ArgumentParser(prog="python -m tests.deploy.k8s_scenario")
    p.add_argument("image")
    p.add_argument("--label", required=True)
    p.add_argument("--figures", type=Path)
    a = p.parse_args(argv)
    report = Report()
    with tempfile.TemporaryDirectory(prefix="embed-scenario-") as tmp:
        try:
            scenario(report, a.image, a.label, Path(tmp))
        except Exception as e:  # a step that could not even run: its reason, then FAILED
            report.check("scenario ran to its end", False, f"{type(e).__name__}: {e}")
    print(json.dumps(report.figures), flush=True)
    if a.figures is not None:
        a.figures.write_text(json.dumps(report.figures))
    failed = [name for name, ok, _ in report.results if not ok]
    print(f"k8s scenario: {len(report.results) - len(failed)} passed, {len(failed)} failed"
          + (f" ({', '.join(failed)})" if failed else ""), flush=True)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())

