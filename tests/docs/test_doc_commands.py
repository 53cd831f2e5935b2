"""Every command and client snippet in README.md and docs/ runs as written.

Against the server ``make run`` starts (tests/docs/conftest.py: the same recipe lines, the
same ports), from a sandbox laid out like the checkout. ``bash`` blocks run as bash
scripts; ``console`` blocks run each ``$ command`` and check its exit status and the output
shown after it (numbers that change from run to run masked); ``python`` and ``js`` blocks
run as they are (a ``js`` block in an async function: Node's CommonJS has no top-level
await). A block this test does not run is listed in NOT_RUN with why and what runs it
instead; a listing that matches no block fails, so the list cannot go stale.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.docs.conftest import ROOT, LiveServer, Sandbox
from tests.docs.doc_blocks import Block, blocks, session_steps, untagged_commands

# (file, text unique to the block) -> why it is not run here, and what runs it instead.
NOT_RUN: dict[tuple[str, str], str] = {
    ("docs/client.md", 'CudaSharedMemoryRegion("embed-gpu"'): "needs a GPU and its driver "
    "beside a server with its tables on it; tests/client/test_client_cuda_shm.py and "
    "tests/service/engine/test_cuda_shm_gpu.py run the same calls (gpu-marked)",
    ("README.md", "make run     #"): "the sandbox fixture runs make run's recipe lines "
    "(tests/docs/conftest.py asserts them against the Makefile) and serves on its ports",
    ("docs/client.md", "npm ci --ignore-scripts"): "reaches the npm registry (no network in "
    "tests); scripts/setup_node.sh runs it in make setup",
    ("docs/deploy.md", "dns:///embedding-service-headless"): "a cluster's DNS name; "
    "nothing here resolves it",
    ("docs/deploy.md", "docker build -f deploy/docker/Dockerfile "): "make image-test "
    "builds both images from a clean clone (scripts/image_test.sh)",
    ("docs/deploy.md", "docker run --rm -p 50051:50051"): "make image-test runs the CPU "
    "image as this command does (tests/deploy/image_check.py)",
    ("docs/deploy.md", "overlays/cpu          # CPU pods"): "needs a Kubernetes API "
    "server (none can run here); tests/deploy renders and validates each overlay",
    ("docs/deploy.md", "kubectl create secret generic embedding-auth"): "needs a Kubernetes "
    "API server; tests/deploy/test_deploy_commands.py parses the exposed overlay's pods",
    ("docs/deploy.md", "torchrun -m training --data /models/.training/corpus"): "the "
    "PyTorchJob's command, on the claim's paths: tests/deploy/test_deploy_commands.py checks "
    "it equals the manifest's and parses it; make image-test runs it in the pods",
    ("docs/deploy.md", "prometheus --config.file="): "tests/deploy/test_deploy_prometheus.py "
    "runs Prometheus on this configuration",
    ("docs/deploy.md", "kubectl label namespace"): "needs a Kubernetes API server",
    ("docs/deploy.md", "embedding-source=REGISTRY/gpt2-source"): "needs a Kubernetes API "
    "server and a registry; make image-test runs the importer Job's pods "
    "(tests/deploy/k8s_scenario.py)",
    ("docs/deploy.md", "cd deploy/k8s/training && kustomize"): "needs the Training Operator "
    "on a cluster; make image-test runs the PyTorchJob's pods (tests/deploy/k8s_scenario.py)",
    ("docs/deploy.md", "cp -r v7/ /models/tiny/.incoming-7"): "a path on the pods' volume; "
    "tests/service/engine/test_copy_in.py copies versions in and out of a live server's repository",
    ("docs/maintainers.md", "make image-test"): "builds Docker images as root for many "
    "minutes; CI runs it after make test",
    ("docs/training.md", "NANOGPT_DIR=/work/nanogpt"): "needs a checkout of nanoGPT outside "
    "the project (never vendored) and minutes of both trainers on the machine",
    ("docs/importers.md", "~/bloom-560m"): "needs the named checkpoints; each form is "
    "run on small models by tests/training/importers/test_importers.py and test_hf_import.py",
    ("docs/importers.md", "~/Qwen3-8B"): "needs the named checkpoints (and installs into the "
    "venv); tests/training/importers/test_discovery.py imports each form on small models",
    ("docs/client.md", "pip install ./client"): "installs into the venv it runs in; "
    "tests/client/test_client_package.py runs exactly this line into a fresh venv",
    ("docs/interop.md", "model(inputs_embeds=inputs_embeds"): "an excerpt of "
    "examples/hf_inputs_embeds.py, which the block above runs whole",
    ("docs/interop.md", "enable_prompt_embeds=True"): "an excerpt of "
    "examples/vllm_prompt_embeds.py, which the block above runs whole",
    ("docs/interop.md", "kubectl apply -k deploy/kserve"): "needs KServe on a cluster; "
    "tests/deploy/test_deploy_kserve.py validates and runs the runtime's arguments",
    ("docs/interop.md", "SERVICE_HOSTNAME="): "needs KServe on a cluster and grpcurl",
    ("docs/performance.md", "make bench  "): "minutes of benchmarks, and gpu_wheels.sh reaches "
    "PyPI; every path of the serving benchmarks runs in tests/bench/test_bench_smoke.py",
    ("docs/performance.md", "python -m bench.soak --clients 4"): "a 3-minute soak; its parts "
    "run in tests/bench/soak",
    ("docs/service.md", "EMBED_OTLP_ENDPOINT=http://otel-collector"): "exports to a "
    "collector on the network; tests/service/test_tracing.py runs it against a local one",
    ("docs/training.md", "--rdzv-endpoint host0:29500"): "two machines",
    ("docs/training.md", "--preset anchor"): "minutes of training benchmarks; "
    "tests/training/bench tests their timing and the nanogpt preset's parts",
}


SERVER_START = re.compile(r"^(scripts/serve\.sh|\.venv/bin/python -m service)\b")


def _listed(b: Block) -> str | None:
    hits = [why for (path, text), why in NOT_RUN.items() if str(b.path) == path and text in b.text]
    assert len(hits) <= 1, f"{b.where}: matched by {len(hits)} NOT_RUN entries"
    return hits[0] if hits else None


ALL = blocks(ROOT)
RUN = [b for b in ALL if b.lang in ("bash", "console", "python", "js") and _listed(b) is None]


def test_every_command_block_is_tagged() -> None:
    untagged = [b.where for b in untagged_commands(ALL)]
    assert untagged == [], "tag these blocks bash, console, python or js so they are run"


def test_every_not_run_entry_names_one_block() -> None:
    for (path, text), _ in NOT_RUN.items():
        where = [b.where for b in ALL if str(b.path) == path and text in b.text]
        assert len(where) == 1, f"NOT_RUN ({path}, {text!r}) matches {where}"


def _mask(line: str) -> str:
    line = re.sub(r"[-+]?\d+\.\d+", "<f>", line)  # values, timings
    line = re.sub(r"\b[0-9a-f]{12}\b", "<id>", line)  # checkpoint ids
    return re.sub(r"\b\d+ us\b", "<n> us", line)


def _pattern(shown: str) -> re.Pattern[str]:
    # "..." in a shown line stands for what the docs elide.
    return re.compile(".*".join(re.escape(part) for part in _mask(shown).split("...")))


def _run_bash(box: Sandbox, b: Block) -> None:
    # A block that ends by starting a server (README's "serve these instead") runs it with
    # the quickstart's server stopped: same ports. It must serve, then drain on SIGTERM.
    lines = b.text.rstrip("\n").splitlines()
    starts = [i for i, ln in enumerate(lines) if SERVER_START.match(ln)]
    assert starts in ([], [len(lines) - 1]), f"{b.where}: a server may only start last"
    script = "\n".join(lines[:-1] if starts else lines)
    r = box.bash(script, timeout=300)
    assert r.returncode == 0, f"{b.where} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr, f"{b.where}:\n{r.stderr}"
    if starts:
        with box.quickstart_stopped():
            server = LiveServer(lines[-1], box.path, box.env)
            assert server.stop() == 0, f"{b.where}: {lines[-1]}\n{server.log}"


def _check_session(box: Sandbox, b: Block) -> None:
    for command, shown in session_steps(b.text):
        r = box.bash(command, timeout=120)
        said = r.stdout + r.stderr
        failing = any(re.match(r"(embedctl|error): ", ln) for ln in shown)
        assert (r.returncode != 0) == failing, (
            f"{b.where}: `{command}` exited {r.returncode}; the docs show "
            f"{'a failure' if failing else 'success'}\n{said}")
        actual = [_mask(ln) for ln in said.splitlines()]
        for line in shown:
            if line.strip() and not line.lstrip().startswith("#"):
                assert any(_pattern(line).fullmatch(a) for a in actual), (
                    f"{b.where}: `{command}` did not print {line!r}; it printed:\n{said}")


@pytest.mark.slow
@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_block_runs_as_written(sandbox: Sandbox, block: Block) -> None:
    if block.lang == "console":
        _check_session(sandbox, block)
        return
    if block.lang == "bash":
        _run_bash(sandbox, block)
        return
    if block.lang == "python":
        r = subprocess.run([".venv/bin/python", "-"], input=block.text, cwd=sandbox.path,
                           env=sandbox.env, capture_output=True, text=True, timeout=120)
    else:
        script = ("(async () => {\n" + block.text +
                  "\n})().catch((e) => { console.error(e); process.exit(1); });\n")
        r = subprocess.run(["node", "-e", script], cwd=sandbox.path, env=sandbox.env,
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{block.where} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr, f"{block.where}:\n{r.stderr}"
