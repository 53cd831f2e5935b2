"""Every example runs as a plain script (``python examples/<name>.py --help``), and each
option of each is checked when parsed: the walk goes over the parser's own options
(tests/option_rules.py)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.option_rules import check_all, walk

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["hf_inputs_embeds", "downstream_service",
                                  "vllm_prompt_embeds", "cuda_inputs_embeds"])
def test_help(name: str, tmp_path: Path) -> None:
    # From another directory: the script must not rely on the repo root being the cwd.
    r = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / f"{name}.py"), "--help"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: python examples/{name}.py")


@pytest.mark.parametrize("name", ["hf_inputs_embeds", "vllm_prompt_embeds",
                                  "cuda_inputs_embeds"])
def test_without_transformers_says_how_to_install_it(name: str, tmp_path: Path) -> None:
    # The environment `make run` makes has no transformers: one line saying so, not a
    # ModuleNotFoundError traceback.
    hide = ("import runpy, sys; sys.modules['transformers'] = None; "
            f"sys.argv = ['{name}.py']; "
            f"runpy.run_path({str(REPO_ROOT / 'examples' / f'{name}.py')!r}, "
            "run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", hide], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr == (f"python examples/{name}.py: needs transformers, which `make setup` "
                        "installs; in the `make run` environment: .venv/bin/pip install "
                        "transformers==5.24.0\n")


def test_the_install_line_names_the_pinned_transformers() -> None:
    assert "transformers==5.24.0\n" in (REPO_ROOT / "requirements-dev.txt").read_text()


def _refusal(prog: str, message: str) -> str:
    return f"python examples/{prog}.py: error: {message} (see --help)"


def _bad(prog: str, option: str, value: str, accepts: str) -> str:
    return _refusal(prog, f"argument {option}: must be {accepts}, got {value!r}")


TARGET_FORM = "host:port (port 1..65535), [IPv6]:port, dns:///host:port or unix:PATH"
NAME = "a model name: letters, digits, '.', '_' or '-', starting with a letter or digit"


def test_downstream_service_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from examples.downstream_service import _version_dir, build_parser, parse_args

    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    assert _version_dir(version) is not None
    (version / "model.safetensors").write_bytes(b"")
    serve = ["--checkpoint", str(version), "--target", "127.0.0.1:50051"]
    p = "downstream_service"
    walk(build_parser(), {
        "text": [(["--text", ""], _bad(p, "--text", "", "non-empty text")),
                 (["--text", "The dog"], None)],
        "checkpoint": [
            (["--checkpoint", str(tmp_path), "--target", "h:1"], _refusal(
                p, f"--checkpoint {tmp_path}: holds no model.safetensors: give a version "
                   f"directory models/<model>/<N> exported by python -m training")),
            (["--checkpoint", str(tmp_path / "no"), "--target", "h:1"],
             _refusal(p, f"--checkpoint {tmp_path / 'no'}: no such directory")),
            (serve, None)],
        "target": [(["--checkpoint", str(version), "--target", "h"],
                    _bad(p, "--target", "h", TARGET_FORM)), (serve, None)],
        "port": [([*serve, "--port", "70000"],
                  _bad(p, "--port", "70000", "a port 1..65535 (0 picks a free port)")),
                 ([*serve, "--port", "0"], None)],
    }, parse_args, capsys)
    check_all([
        (["--checkpoint", str(version)], _refusal(
            p, "--checkpoint needs --target: the embedding service serving that version")),
        (["--target", "h:1"], _refusal(
            p, "--target needs --checkpoint: the version whose blocks run here")),
        (["--port", "5"], _refusal(p, "--port needs --checkpoint: the port is the served "
                                      "downstream service's; the demo picks a free one")),
    ], parse_args, capsys)


@pytest.mark.parametrize("p", ["hf_inputs_embeds", "cuda_inputs_embeds"])
def test_inputs_embeds_options(p: str, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """The CPU example and its GPU twin take the same options by the same rules (the GPU
    one checks them all before it looks for a CUDA device)."""
    module = importlib.import_module(f"examples.{p}")
    build_parser, parse_args = module.build_parser, module.parse_args
    (tmp_path / "config.json").write_text("{}")
    remote = ["--target", "127.0.0.1:50051", "--hf-dir", str(tmp_path)]
    walk(build_parser(), {
        "text": [(["--text", ""], _bad(p, "--text", "", "non-empty text")),
                 (["--text", "a"], None)],
        "start_position": [(["--start-position", "-1"], _bad(
            p, "--start-position", "-1", "a position in [0, 4294967295]")),
                           (["--start-position", "0"], None)],
        "target": [(["--target", "http://h:1", "--hf-dir", str(tmp_path)],
                    _bad(p, "--target", "http://h:1", TARGET_FORM)), (remote, None)],
        "hf_dir": [(["--target", "h:1", "--hf-dir", str(tmp_path / "no")],
                    _refusal(p, f"--hf-dir {tmp_path / 'no'}: no such directory")),
                   (["--target", "h:1", "--hf-dir", str(tmp_path.parent)], _refusal(
                       p, f"--hf-dir {tmp_path.parent}: holds no config.json: give the "
                          f"directory save_pretrained wrote")),
                   (remote, None)],
        "model": [(["--model", "a b"], _bad(p, "--model", "a b", NAME)),
                  (["--model", "gpt2"], None)],
        "seed": [(["--seed", "-1"], _bad(p, "--seed", "-1", "an integer in [0, 4294967295]")),
                 (["--seed", "3"], None)],
    }, parse_args, capsys)
    check_all([
        (["--target", "h:1"], _refusal(p, "--target needs --hf-dir: the saved HF GPT-2 whose "
                                          "tables that service serves")),
        (["--hf-dir", str(tmp_path)], _refusal(
            p, "--hf-dir needs --target: the running service serving its tables")),
        ([*remote, "--seed", "1"], _refusal(
            p, "--seed and --target cannot go together: --seed initialises the local random "
               "model; with --target the model is --hf-dir's")),
    ], parse_args, capsys)


def test_vllm_prompt_embeds_options(capsys: pytest.CaptureFixture[str]) -> None:
    from examples.vllm_prompt_embeds import build_parser, parse_args

    p = "vllm_prompt_embeds"
    walk(build_parser(), {
        "text": [(["--text", ""], _bad(p, "--text", "", "non-empty text")),
                 (["--text", "a"], None)],
        "dtype": [(["--dtype", "fp16"], _bad(p, "--dtype", "fp16", "one of bfloat16, float16, "
                                                                    "float32")),
                  (["--dtype", "float16"], None)],
        "target": [(["--target", "h:0"], _bad(p, "--target", "h:0", TARGET_FORM)),
                   (["--target", "h:1"], None)],
        "model": [(["--target", "h:1", "--model", "../m"], _bad(
            p, "--model", "../m", f"{NAME} ('' = the server's default model)")),
                  (["--target", "h:1", "--model", "tiny"], None)],
    }, parse_args, capsys)
    check_all([(["--model", "tiny"], _refusal(
        p, "--model needs --target: the local demo serves one model, gpt2"))], parse_args,
        capsys)
