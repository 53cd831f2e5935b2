"""Run a built image as docs/deploy.md says and check what it serves (scripts/image_test.sh).

    python -m tests.deploy.image_check IMAGE --label embed-image-test=RUN [--kind cpu|cuda]

Not a pytest module (it needs a Docker engine and a built image): `make image-test` builds the
image from a clean clone and runs this. With ``--kind cpu`` it writes a model repository on
the host as THIS user (root in CI) with umask 077, starts the image over it (its own non-root
uid 10001, host network on loopback, read-only root filesystem with a tmpfs at /tmp), and
checks: start-up to SERVING, the HEALTHCHECK turning healthy, a native ``Embed`` and an OIP
``ModelInfer`` bit-exact against the tables read from the checkpoint on the host, ``/metrics``,
a version the image may not read refused with a plain message, the uid, the read-only root,
and SIGTERM draining to exit 0 within the grace period. ``--kind cuda`` runs only the checks
that need no GPU (contents, uid, torch build). Every step is printed with its time; the exit
status is 1 if any check failed. The figures go to ``--figures`` (JSON) for the shell script.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from client import EmbeddingClient
from service.format.checkpoint import read_checkpoint
from service.format.manifest import EMBEDDINGS_FILE
from service.format.tokenizer import default_ranks_path, gpt2_spec, load_tokenizer
from service.format.writer import write_checkpoint
from tests.deploy.served import IDS, model_infer, serving

IMAGE_UID = 10001  # the Dockerfiles' USER 10001:10001
STOP_GRACE_S = 30  # docs/deploy.md: docker stop -t 30 (the server drains for 10 s at most)
MODEL = "tiny"
LOCKED = "locked"  # a version whose tables only their writer may read
TEXT = "The container image, built and run for real."
START_POSITION = 3
DIM, MAX_SEQ_LEN, TABLE_ROWS, VOCAB = 64, 128, 50304, 50257


@dataclass
class Report:
    """Each check's result, in order, and the measured figures."""

    t0: float = field(default_factory=time.monotonic)
    results: list[tuple[str, bool, str]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def step(self, text: str) -> None:
        print(f"  [{time.monotonic() - self.t0:6.1f}s] {text}", flush=True)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.results.append((name, ok, detail))
        self.step(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
        return ok

    def attempt(self, name: str, fn: Callable[[], str]) -> bool:
        """Run one check; an exception is its failure, with the reason."""
        try:
            return self.check(name, True, fn())
        except Exception as e:
            return self.check(name, False, f"{type(e).__name__}: {e}")

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.results)


def docker(*args: str, check: bool = True,
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])} ...: rc {proc.returncode}: "
                           f"{proc.stderr.strip()[-400:]}")
    return proc


def inspect(ref: str, fmt: str) -> Any:
    return json.loads(docker("inspect", "--format", "{{json " + fmt + "}}", ref).stdout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def write_repository(root: Path) -> Path:
    """models/tiny/1 (readable) and models/locked/1 (tables 0600), written by this user with
    umask 077: only write_checkpoint's own modes make ``tiny`` readable to the image's uid."""
    g = torch.Generator().manual_seed(21)
    repo = root / "models"
    with umask(0o077):
        for name in (MODEL, LOCKED):
            write_checkpoint(repo / name / "1",
                             token_table=torch.randn(TABLE_ROWS, DIM, generator=g),
                             position="learned", max_seq_len=MAX_SEQ_LEN, vocab_size=VOCAB,
                             tokenizer_spec=gpt2_spec(), tokenizer_ranks=default_ranks_path(),
                             position_table=torch.randn(MAX_SEQ_LEN, DIM, generator=g),
                             provenance={"source": "image-test"})
    os.chmod(repo / LOCKED / "1" / EMBEDDINGS_FILE, 0o600)  # what the old writer left
    return repo


def reference(repo: Path, ids: list[int], start: int) -> bytes:
    """token_table[ids] + position_table[start:start+T] in fp32, from the checkpoint on disk."""
    ckpt = read_checkpoint(repo / MODEL / "1")
    assert ckpt.position_table is not None
    idx = torch.tensor(ids)
    rows = ckpt.token_table[idx] + ckpt.position_table[start:start + len(ids)]  # (T, C)
    return rows.to(torch.float32).numpy().tobytes()


def wait_serving(target: str, container: str, deadline_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if serving(target):
            return time.monotonic() - t0
        if not inspect(container, ".State.Running"):
            raise RuntimeError("container exited: " + docker("logs", container).stderr[-2000:])
        time.sleep(0.1)
    raise TimeoutError(f"not SERVING after {deadline_s:.0f} s")


def wait_healthy(container: str, deadline_s: float) -> str:
    t0 = time.monotonic()
    status = ""
    while time.monotonic() - t0 < deadline_s:
        status = inspect(container, ".State.Health.Status")
        if status in ("healthy", "unhealthy"):
            break
        time.sleep(1)
    if status != "healthy":
        log = inspect(container, ".State.Health.Log")
        raise RuntimeError(f"health status {status!r}; last probe: {log[-1:]}")
    return f"{status} after {time.monotonic() - t0:.1f} s more"


def static_checks(report: Report, image: str, kind: str) -> None:
    """What is inside the image, read without starting the server (no GPU needed)."""
    size = int(docker("image", "inspect", "--format", "{{.Size}}", image).stdout)
    report.figures["image_size_bytes"] = size
    report.step(f"image size {size / 1e6:.0f} MB")

    def user() -> str:
        got = inspect(image, ".Config.User")
        assert got == f"{IMAGE_UID}:{IMAGE_UID}", got
        return f"USER {got}"

    def lean() -> str:
        script = ("for c in gcc cc c++ g++ clang make ld as; do command -v $c; done; "
                  "for d in /app/tests /app/.git /app/models /app/.tools /app/.mypy_cache "
                  "/app/bench/results /root/.cache /tmp/pip*; do [ -e $d ] && echo $d; done; "
                  "true")
        out = docker("run", "--rm", "--network", "none", "--user", "0", "--entrypoint", "sh",
                     image, "-c", script).stdout.split()
        assert out == [], f"found in the image: {out}"
        return ("no compiler (gcc cc c++ g++ clang make ld as), no tests/.git/models/.tools, "
                "no pip cache")

    def breakdown() -> str:
        script = ("for d in /app/.venv/lib/python3*/site-packages/torch /app/.venv /app /usr; "
                  "do du -sm $d 2>/dev/null; done")  # one du each: du counts a file once
        out = docker("run", "--rm", "--network", "none", "--user", "0", "--entrypoint", "sh",
                     image, "-c", script).stdout.split()
        sizes = {path: int(mb) for mb, path in zip(out[::2], out[1::2])}
        report.figures["size_mb"] = sizes
        return ", ".join(f"{path} {mb} MB" for path, mb in sizes.items())

    def venv() -> str:
        cfg = docker("run", "--rm", "--network", "none", "--entrypoint", "cat", image,
                     "/app/.venv/pyvenv.cfg").stdout
        home = dict(ln.split(" = ", 1) for ln in cfg.splitlines() if " = " in ln)["home"]
        assert home.startswith(("/usr/bin", "/usr/local/bin")), f"venv home {home}: a host venv?"
        return f"the image's own venv (home = {home})"

    def torch_build() -> str:
        out = docker("run", "--rm", "--network", "none", "--read-only", "--entrypoint",
                     "/app/.venv/bin/python", image, "-c",
                     "import torch; print(torch.__version__, torch.version.cuda)").stdout.split()
        version, cuda = out
        want_cuda = kind == "cuda"
        assert (cuda != "None") == want_cuda, out
        assert want_cuda or version.endswith("+cpu"), out
        return f"torch {version}, CUDA {cuda}"

    def lookup_kernel() -> str:
        # Built in the image's build stage; loaded on a read-only root as the server does.
        script = ("from service.engine import kernel; lib = kernel.load(); "
                  "print(lib is not None, kernel.guarded(), kernel.library_path().name)")
        out = docker("run", "--rm", "--network", "none", "--read-only", "--entrypoint",
                     "/app/.venv/bin/python", image, "-c", script).stdout.split()
        assert out[:2] == ["True", "True"], f"lookup kernel not served: {out}"
        return f"one-pass lookup kernel {out[2]} loaded, SIGBUS guard installed"

    report.attempt("image user is the non-root uid", user)
    report.attempt("lean: nothing but the runtime", lean)
    report.attempt("venv made in the image", venv)
    report.attempt("size breakdown (du)", breakdown)
    report.attempt(f"{kind} torch build", torch_build)
    report.attempt("lookup kernel from the build stage", lookup_kernel)


def serve_checks(report: Report, image: str, label: str, work: Path) -> None:
    """Start the image over a host-written repository, as docs/deploy.md says."""
    repo = write_repository(work)
    report.step(f"repository written as uid {os.getuid()} with umask 077: {repo}")
    grpc_port, metrics_port = free_port(), free_port()
    target = f"127.0.0.1:{grpc_port}"
    name = f"embed-image-test-{os.getpid()}"
    # docs/deploy.md's command, with the host network on loopback (no -p) and a read-only
    # root filesystem: /tmp (HOME) is the only place written.
    http_port = free_port()  # the REST front (--http-port), on a free port: host network
    argv = ["run", "-d", "--name", name, "--label", label, "--network", "host",
            "--read-only", "--tmpfs", "/tmp:rw,nosuid,nodev,size=64m",
            "-v", f"{repo}:/models:ro",
            "-e", "EMBED_HOST=127.0.0.1", "-e", f"EMBED_GRPC_PORT={grpc_port}",
            "-e", f"EMBED_HTTP_PORT={http_port}",
            "-e", f"EMBED_METRICS_PORT={metrics_port}", image, "--poll-seconds", "30",
            # The locked version was just written: without this it would be "not ready yet"
            # for the load grace (a copy in progress) and refused only 30 s later.
            "--load-grace-seconds", "0"]
    report.step("docker " + " ".join(argv))
    t_run = time.monotonic()
    docker(*argv)
    try:
        startup = wait_serving(target, name, 300)
        report.figures["startup_to_serving_s"] = round(startup, 2)
        report.check("start-up to SERVING", True, f"{startup:.1f} s from docker run")
        report.attempt("HEALTHCHECK turns healthy", lambda: wait_healthy(name, 180))

        def embed() -> str:
            tok = load_tokenizer(gpt2_spec(), default_ranks_path())
            with EmbeddingClient(target) as c:
                by_ids = c.embed(ids=IDS, model=MODEL)
                by_text = c.embed(TEXT, model=MODEL, start_position=START_POSITION)
            assert by_ids.array.dtype == np.float32
            assert by_ids.array.shape == (len(IDS), DIM)
            assert by_ids.array.tobytes() == reference(repo, IDS, 0), "ids: bytes differ"
            assert by_text.token_ids == tok.encode(TEXT), "text: token ids differ"
            want = reference(repo, by_text.token_ids, START_POSITION)
            assert by_text.array.tobytes() == want, "text: bytes differ"
            return (f"ids [{len(IDS)}x{DIM}] and text [{len(by_text.token_ids)}x{DIM}] at "
                    f"position {START_POSITION}: bit-exact (version {by_ids.version}, "
                    f"checkpoint {by_ids.checkpoint_id[:12]})")

        def infer() -> str:
            resp = model_infer(target, MODEL)
            out = resp.outputs[0]
            assert (out.name, out.datatype, list(out.shape)) == (
                "embeddings", "FP32", [1, len(IDS), DIM]), out
            assert resp.raw_output_contents[0] == reference(repo, IDS, 0), "bytes differ"
            return f"[1x{len(IDS)}x{DIM}] FP32 bit-exact"

        report.attempt("native Embed (project client) bit-exact", embed)
        report.attempt("OIP ModelInfer bit-exact", infer)

        def http_infer() -> str:
            body = json.dumps({
                "inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, len(IDS)],
                            "data": IDS}],
                "parameters": {"binary_data_output": True}}).encode()
            url = f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/infer"
            req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                header_len = int(r.headers["Inference-Header-Content-Length"])
                data = r.read()
            header = json.loads(data[:header_len])
            out = header["outputs"][0]
            assert (out["name"], out["datatype"], out["shape"]) == (
                "embeddings", "FP32", [1, len(IDS), DIM]), out
            size = out["parameters"]["binary_data_size"]
            rows = data[header_len:header_len + size]
            assert rows == reference(repo, IDS, 0), "bytes differ"
            return f"REST infer [1x{len(IDS)}x{DIM}] FP32, binary output: bit-exact"

        report.attempt("HTTP (REST v2) infer bit-exact", http_infer)

        def metrics() -> str:
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as r:
                text = r.read().decode()
            for want in (f'embed_requests_total{{code="OK",model="{MODEL}",rpc="Embed"}} 2.0',
                         f'embed_requests_total{{code="OK",model="{MODEL}",rpc="ModelInfer"}} 1.0',
                         f'embed_model_loads_total{{model="{LOCKED}",result="error"}} 1.0'):
                assert want in text, f"missing {want!r}"
            assert "embed_model_info{" in text
            return f"{url}: request and model-load counters as sent"

        def refused() -> str:
            logs = docker("logs", name).stderr + docker("logs", name).stdout
            want = (f"refused model={LOCKED} version=1: permission denied reading "
                    f"/models/{LOCKED}/1/{EMBEDDINGS_FILE} as uid {IMAGE_UID} gid {IMAGE_UID}")
            (line,) = [ln for ln in logs.splitlines() if want in ln]
            assert "Traceback" not in logs, "a traceback in the logs"
            return line[line.index("refused"):][:160] + "…"

        def user() -> str:
            ids = docker("exec", name, "sh", "-c", "id -u; id -g; "
                         "grep -E '^(Uid|Gid):' /proc/1/status").stdout.split()
            assert ids[:2] == [str(IMAGE_UID)] * 2, ids
            assert ids[2:] == ["Uid:", *[str(IMAGE_UID)] * 4, "Gid:", *[str(IMAGE_UID)] * 4], ids
            return f"server process (pid 1) runs as uid/gid {IMAGE_UID}"

        def read_only() -> str:
            assert inspect(name, ".HostConfig.ReadonlyRootfs") is True
            probe = docker("exec", name, "sh", "-c", "touch /app/probe", check=False)
            assert probe.returncode != 0, probe
            assert "Read-only file system" in probe.stderr, probe
            docker("exec", name, "sh", "-c", "touch /tmp/probe && rm /tmp/probe")
            return "/app not writable (Read-only file system); /tmp (tmpfs) writable"

        report.attempt("/metrics answers", metrics)
        report.attempt("unreadable version refused plainly", refused)
        report.attempt("runs as the non-root uid", user)
        report.attempt("read-only root filesystem", read_only)

        def sigterm() -> str:
            t0 = time.monotonic()
            docker("stop", "-t", str(STOP_GRACE_S), name, timeout=STOP_GRACE_S + 30)
            took = time.monotonic() - t0
            report.figures["sigterm_to_exit_s"] = round(took, 2)
            code = inspect(name, ".State.ExitCode")
            assert code == 0, f"exit code {code}"
            assert took < STOP_GRACE_S, f"took {took:.1f} s, grace {STOP_GRACE_S} s"
            tail = docker("logs", "--tail", "1", name).stderr.strip().splitlines()[-1:]
            return f"exit 0 after {took:.1f} s (grace {STOP_GRACE_S} s); last log: {tail}"

        report.attempt("SIGTERM drains, exit 0 within the grace period", sigterm)
        report.figures["run_s"] = round(time.monotonic() - t_run, 1)
    finally:
        if not report.ok:
            print(docker("logs", "--tail", "40", name, check=False).stderr, flush=True)
        docker("rm", "-f", name, check=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("image")
    p.add_argument("--label", required=True, help="key=value put on every container")
    p.add_argument("--kind", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--figures", type=Path, help="write the measured figures here (JSON)")
    args = p.parse_args(argv)
    report = Report()
    static_checks(report, args.image, args.kind)
    if args.kind == "cpu":
        work = Path(tempfile.mkdtemp(prefix="embed-image-test-"))
        try:
            serve_checks(report, args.image, args.label, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if args.figures:
        args.figures.write_text(json.dumps(report.figures) + "\n")
    failed = [name for name, ok, _ in report.results if not ok]
    print(f"  {len(report.results) - len(failed)}/{len(report.results)} checks passed"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
