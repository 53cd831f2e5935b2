"""Every program a manifest starts accepts what the manifest passes.

Each kustomization an operator applies is rendered (``kubectl kustomize``, as the other
deploy tests do); each container's command, args and environment (env, envFrom, the
image's own ENV, and for a PyTorchJob what the Training Operator adds) are parsed by the
project's real parsers: ``service.config.parse_config`` behind the image's entrypoint,
torchrun's own argument parser then ``training.config.parse_config`` for the module it
runs, ``training.importers``' parser for the importer. An unknown flag, a bad value, a
path the program writes that a read-only root filesystem would refuse, or a path it reads
that no volume provides fails, naming the manifest, the container and the field.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Callable, Iterator
from pathlib import PurePosixPath
from typing import Any

import pytest

from tests.deploy.conftest import DEPLOY
from tests.deploy.pod_specs import (
    IMAGE_ENTRYPOINT,
    IMAGE_WORKDIR,
    KUSTOMIZATIONS,
    Container,
    containers,
    operator_env,
    render,
)

# Containers that run the operator's own images, by image name: the command each runs
# (None: the image's own, not known here) and why it is not ours to parse.
FOREIGN = {
    "embedding-models": (("cp", "-a", "/models/.", "/target/"),
                         "model image (components/model-image): plain cp"),
    "embedding-source": (("cp", "-R", "/source/.", "/staging/"),
                         "checkpoint image (deploy/k8s/import): plain cp"),
    "your-shm-consumer": (None, "placeholder for the operator's consumer (overlays/shm-sidecar)"),
}
TORCHRUN = "/app/.venv/bin/torchrun"
PYTHON = "/app/.venv/bin/python"


def _image_env() -> dict[str, str]:
    """The ENV the Dockerfile bakes into the image (the pods inherit it)."""
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    env: dict[str, str] = {}
    for block in re.findall(r"^ENV ((?:.*\\\n)*.*)$", text, flags=re.M):
        env.update(re.findall(r"([A-Z_][A-Z0-9_]*)=(\S+)", block))
    return env


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """torchrun's parser reads PET_* from os.environ while it is built: give it the pod's."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _parse(where: str, what: str, fn: Callable[[], Any]) -> Any:
    """Run a parser; its exit (argparse's usage error) becomes one line naming where."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return fn()
    except SystemExit as e:
        last = [ln for ln in err.getvalue().splitlines() if ln.strip()][-1:] or [str(e)]
        raise AssertionError(f"{where}: {what}: {last[0]}") from None


def _absolute(c: Container, path: str) -> str:
    cwd = c.spec.get("workingDir", IMAGE_WORKDIR)
    return str(PurePosixPath(cwd) / path) if not path.startswith("/") else path


def _must_write(c: Container, field: str, path: str, problems: list[str]) -> None:
    full = _absolute(c, path)
    if not c.writable(full):
        m = c.mount_of(full)
        why = (f"on volume {m.volume}, mounted read-only" if m is not None
               else "on the read-only root filesystem (no volume mounted there)")
        problems.append(f"{c.where}: {field}={path!r} is written to, but {full} is {why}")


def _must_read(c: Container, field: str, path: str, problems: list[str]) -> None:
    full = _absolute(c, path)
    if c.mount_of(full) is None:
        problems.append(f"{c.where}: {field}={path!r}: {full} is not in any volume "
                        f"(the image has no such data)")


def _check_server(c: Container, argv: list[str], env: dict[str, str],
                  problems: list[str]) -> None:
    from service.config import parse_config

    cfg = _parse(c.where, f"args {argv}", lambda: parse_config(argv, environ=env))
    _must_read(c, "model_repository", str(cfg.model_repository), problems)
    for name in ("tls_cert", "tls_key", "tls_client_ca", "auth_tokens"):
        if getattr(cfg, name):
            _must_read(c, name, getattr(cfg, name), problems)


def _check_training(c: Container, argv: list[str], env: dict[str, str],
                    problems: list[str]) -> None:
    from torch.distributed.run import get_args_parser

    from training.config import parse_config

    def torchrun() -> Any:
        with _environ(env):
            return get_args_parser().parse_args(argv)
    run = _parse(c.where, f"torchrun args {argv}", torchrun)
    if not (run.module and run.training_script == "training"):
        problems.append(f"{c.where}: torchrun must run `-m training`, runs "
                        f"{run.training_script!r} (module={run.module})")
        return
    _must_write(c, "torchrun's log dir (TMPDIR)", env.get("TMPDIR", "/tmp"), problems)
    cfg = _parse(c.where, f"training args {run.training_script_args}",
                 lambda: parse_config(run.training_script_args, env=env))
    for name in ("cache_dir", "runs_dir", "out_repository"):
        _must_write(c, name, getattr(cfg, name), problems)
    for path in cfg.data:
        _must_read(c, "data", path, problems)
    if not cfg.data:
        problems.append(f"{c.where}: no --data: the job would train on the built-in "
                        f"pydoc_data sample")


def _check_importer(c: Container, argv: list[str], problems: list[str]) -> None:
    from training.importers.cli import _parser

    args = _parse(c.where, f"args {argv}", lambda: _parser().parse_args(argv))
    if args.out is None:
        problems.append(f"{c.where}: no --out: the importer would write nothing")
        return
    _must_write(c, "--out", str(PurePosixPath(args.out).parent), problems)
    _must_read(c, "source", str(getattr(args, "dir", None) or args.ckpt), problems)


def check(c: Container) -> list[str]:
    """Every problem of container ``c`` (empty when its program accepts all it is given)."""
    problems: list[str] = []
    if not c.ours:
        repo = c.image.rsplit("/", 1)[-1].split(":", 1)[0]
        command = tuple(c.spec["command"]) if "command" in c.spec else None
        if repo not in FOREIGN or FOREIGN[repo][0] != command:
            problems.append(f"{c.where}: image {c.image} runs {command}, which no test "
                            f"parses: add its program here")
        elif command is not None:  # cp: its target must be writable
            _must_write(c, "cp target", command[-1].rstrip("/") or "/", problems)
        return problems
    env = {**_image_env(), **c.env}
    if c.owner_kind == "PyTorchJob":
        env.update(operator_env(_job(c)))
    if c.read_only_root and "HOME" in env:
        _must_write(c, "HOME", env["HOME"], problems)
    argv = c.argv
    if tuple(argv[:len(IMAGE_ENTRYPOINT)]) == IMAGE_ENTRYPOINT:
        _check_server(c, argv[len(IMAGE_ENTRYPOINT):], env, problems)
    elif argv[0] == TORCHRUN:
        _check_training(c, argv[1:], env, problems)
    elif argv[:3] == [PYTHON, "-m", "training.importers"]:
        _check_importer(c, argv[3:], problems)
    else:
        problems.append(f"{c.where}: command {argv[:3]} is none of the image's programs")
    return problems


_JOBS: dict[str, dict[str, Any]] = {}


def _job(c: Container) -> dict[str, Any]:
    return _JOBS[c.owner_name]


@pytest.fixture(scope="module")
def rendered_all(kubectl: str) -> dict[str, list[dict[str, Any]]]:
    out = {name: render(kubectl, name) for name in KUSTOMIZATIONS}
    for objs in out.values():
        _JOBS.update({o["metadata"]["name"]: o for o in objs if o["kind"] == "PyTorchJob"})
    return out


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_every_container_accepts_what_its_manifest_passes(
        name: str, rendered_all: dict[str, list[dict[str, Any]]]) -> None:
    found = containers(name, rendered_all[name])
    assert found, f"{name}: renders no container"
    problems = [p for c in found for p in check(c)]
    assert problems == []


def test_the_image_entrypoint_and_workdir_are_what_the_checks_assume() -> None:
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert f'ENTRYPOINT ["{IMAGE_ENTRYPOINT[0]}"]' in text
    assert f"WORKDIR {IMAGE_WORKDIR}" in text
    assert _image_env()["EMBED_MODEL_REPOSITORY"] == "/models"


def _training(rendered_all: dict[str, list[dict[str, Any]]]) -> Container:
    (worker,) = [c for c in containers("training", rendered_all["training"])
                 if c.role == "Worker"]
    return worker


def test_the_old_training_command_is_refused_naming_the_manifest(
        rendered_all: dict[str, list[dict[str, Any]]]) -> None:
    """Negative control: what pytorchjob.yaml used to pass fails, with argparse's own line."""
    c = _training(rendered_all)
    c.spec = {**c.spec, "args": ["-m", "training", "--model-repository", "/models",
                                 "--model", "gpt2-small"]}
    with pytest.raises(AssertionError) as e:
        check(c)
    msg = str(e.value)
    assert msg.startswith("training PyTorchJob/embedding-train Worker container pytorch: "
                          "training args ")
    assert msg.endswith("error: unrecognized arguments: --model-repository /models "
                        "--model gpt2-small (see --help)")


def test_a_relative_cache_dir_is_refused_on_a_read_only_root(
        rendered_all: dict[str, list[dict[str, Any]]]) -> None:
    c = _training(rendered_all)
    args = list(c.spec["args"])
    args[args.index("--cache-dir") + 1] = "data_cache"
    c.spec = {**c.spec, "args": args}
    assert check(c) == [
        "training PyTorchJob/embedding-train Worker container pytorch: cache_dir='data_cache'"
        " is written to, but /app/data_cache is on the read-only root filesystem (no volume"
        " mounted there)"]


def test_a_bad_environment_value_is_refused(
        rendered_all: dict[str, list[dict[str, Any]]]) -> None:
    (server,) = containers("overlays/cpu", rendered_all["overlays/cpu"])
    server.env["EMBED_GRPC_PORT"] = "fifty"
    with pytest.raises(AssertionError, match=r"^overlays/cpu Deployment/embedding-service "
                       r"Deployment container server: args \[\]: python -m service: error: "
                       r"EMBED_GRPC_PORT: must be a port 1\.\.65535 \(0 picks a free port\), "
                       r"got 'fifty' \(see --help\)$"):
        check(server)


def test_a_read_only_export_and_a_corpus_on_no_volume_are_refused(
        rendered_all: dict[str, list[dict[str, Any]]]) -> None:
    c = _training(rendered_all)
    c.mounts = [m if m.volume != "models" else type(m)(m.path, m.volume, True, m.kind,
                                                        m.source) for m in c.mounts]
    assert [p.split(": ", 1)[1] for p in check(c)] == [
        "runs_dir='/models/.training/runs' is written to, but /models/.training/runs is "
        "on volume models, mounted read-only",
        "out_repository='/models' is written to, but /models is on volume models, mounted "
        "read-only"]
    c.mounts = [m for m in c.mounts if m.volume != "models"]
    assert [p.split(": ", 1)[1] for p in check(c) if "data=" in p] == [
        "data='/models/.training/corpus': /models/.training/corpus is not in any volume "
        "(the image has no such data)"]


def test_the_docs_show_the_commands_the_manifests_run(
        rendered_all: dict[str, list[dict[str, Any]]]) -> None:
    """docs/deploy.md's training command and importer args are the manifests' own."""
    doc = (DEPLOY.parent / "docs" / "deploy.md").read_text()
    block = doc.split("```bash\ntorchrun -m training ", 1)[1].split("\n```", 1)[0]
    shown = ["-m", "training", *block.replace("\\\n", " ").split()]
    assert shown == _training(rendered_all).spec["args"]
    (importer,) = [c for c in containers("import", rendered_all["import"]) if not c.init]
    assert f"`{' '.join(importer.spec['args'])}`" in doc
