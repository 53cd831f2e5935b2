"""``python -m training``'s options, each checked when parsed (training/config_rules.py's
RULES) or, for the directories it writes, before any work; every EMBED_TRAIN_* variable by
the same rule, naming the variable. The walk goes over the parser's own options
(tests/option_rules.py)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from tests.option_rules import Case, Cases, OneEach, check_all, one_each, outcome, walk
from tests.tiny_model import MakeCheckpoint
from training import default_model
from training.__main__ import check_inputs
from training.config import TrainConfig, _parser, parse_config
from training.errors import UsageError

PROG = "python -m training: error: "


def bad(flag: str, value: str, accepts: str) -> Case:
    return ([flag, value], f"{PROG}argument {flag}: must be {accepts}, got {value!r} "
                           f"(see --help)")


def switch(flag: str) -> list[Case]:
    return [([f"{flag}=1"], f"{PROG}argument {flag}/--no-{flag[2:]}: ignored explicit "
                            f"argument '1' (see --help)"), ([flag], None)]


# The options one refused and one accepted value show: (option, a refused value, what the
# option accepts, an accepted value).
ONE_EACH: list[OneEach] = [
    ("--n-layer", "0", "a number of blocks >= 1", "1"),
    ("--n-head", "-4", "a number of heads >= 1", "8"),
    ("--n-embd", "0", "a width >= 1", "64"),
    ("--block-size", "0", "a number of positions >= 1", "16"),
    ("--dropout", "1", "a number in [0, 1)", "0.1"),
    ("--position", "rotary", "one of learned, sinusoidal, none", "none"),
    ("--table-rows", "50256", "a number of rows >= 50257 (GPT-2's ids, plus padding)", "50257"),
    ("--head-precision", "fp16", "one of auto, fp32, bf16", "bf16"),
    ("--block-precision", "auto", "one of fp32, bf16", "bf16"),
    ("--batch-size", "0", "a number of sequences >= 1", "2"),
    ("--grad-accum", "0", "a number of micro-batches >= 1", "2"),
    ("--max-steps", "0", "a number of steps >= 1", "1"),
    ("--min-lr-ratio", "2", "a number in [0, 1]", "0"),
    ("--warmup-steps", "-1", "a number of steps >= 0", "0"),
    ("--weight-decay", "-0.1", "a number >= 0", "0"),
    ("--beta1", "1.5", "a number in [0, 1)", "0.8"),
    ("--beta2", "1", "a number in [0, 1)", "0.999"),
    ("--grad-clip", "-1", "a number >= 0 (0 = off)", "0"),
    ("--adamw-impl", "apex", "one of single, foreach, fused", "foreach"),
    ("--eval-every", "0", "a number of steps >= 1", "10"),
    ("--eval-tokens", "0", "a number of tokens >= 1", "1"),
    ("--checkpoint-every", "-1", "a number of steps >= 0 (0 = only at the end)", "10"),
    ("--stop-at", "-1", "a step >= 0 (0 = run to --max-steps)", "50"),
    ("--seed", "-1", "an integer in [0, 9223372036854775807]", "0"),
    ("--device", "gpu", "auto, cpu, cuda or cuda:N", "cpu"),
    ("--compile-min-steps", "-1", "a number of steps >= 0 (0 = only with --compile)", "0"),
    ("--threads", "-3", "an integer >= 0 (0 = this process's share of the cores)", "1"),
]


def cases(tmp: Path) -> Cases:
    (tmp / "file").write_text("")
    gone = tmp / "gone" / "x"
    name = "a model name: letters, digits, '.', '_' or '-', starting with a letter or digit"
    return {
        **one_each(bad, ONE_EACH),
        "data": [bad("--data", "", "a file, glob, directory or .jsonl file"),
                 (["--data", str(tmp / "none.txt")],
                  f"{PROG}--data {tmp / 'none.txt'}: no such file or directory (relative to "
                  f"{Path.cwd()})"),
                 (["--data", str(tmp / "c.txt"), str(tmp / "*.txt")], None)],
        "val_fraction": [bad("--val-fraction", "1", "a number in (0, 1)"),
                         bad("--val-fraction", "0", "a number in (0, 1)"),
                         (["--val-fraction", "0.05"], None)],
        "cache_dir": [(["--cache-dir", str(gone)], f"{PROG}--cache-dir {gone}: the directory "
                       f"{gone.parent} does not exist; create it first"),
                      (["--cache-dir", str(tmp / "new")], None)],
        "tie_weights": switch("--tie-weights"),
        "sparse_embeddings": switch("--sparse-embeddings"),
        "loss_chunk": [bad("--loss-chunk", "-5", "a number of rows >= 0 (0 = full logits)"),
                       (["--loss-chunk", "0", "--head-precision", "fp32"], None)],
        "lr": [bad("--lr", "-1", "a number > 0"), bad("--lr", "nan", "a number > 0"),
               (["--lr", "6e-4"], None)],
        "resume": [(["--resume=1"], f"{PROG}argument --resume/--no-resume: ignored explicit "
                                     f"argument '1' (see --help)"), (["--no-resume"], None)],
        "resume_if_present": switch("--resume-if-present"),
        "compile": switch("--compile"),
        "out_repository": [(["--out-repository", str(tmp / "file")],
                            f"{PROG}--out-repository {tmp / 'file'}: is a file, not a "
                            f"directory"),
                           (["--out-repository", str(tmp / "models2")], None)],
        "name": [bad("--name", "../x", name), bad("--name", ".hidden", name),
                 (["--name", "my-model_2.1"], None)],
        "runs_dir": [(["--runs-dir", str(gone)], f"{PROG}--runs-dir {gone}: the directory "
                      f"{gone.parent} does not exist; create it first"),
                     (["--runs-dir", str(tmp)], None)],
        "export": [(["--export=0"], f"{PROG}argument --export/--no-export: ignored explicit "
                                    f"argument '0' (see --help)"), (["--no-export"], None)],
        "progress": switch("--progress"),
    }


def checked(tmp: Path, env: dict[str, str] | None = None) -> object:
    """What ``python -m training`` does before any work: parse, then check_inputs."""
    (tmp / "c.txt").write_text("some text\n")

    def run(argv: list[str]) -> TrainConfig:
        # --out-repository stays the default (models, in the working directory): giving it
        # would make --no-export a mistake.
        cfg = parse_config(["--data", str(tmp / "c.txt"), "--runs-dir", str(tmp / "runs"),
                            "--cache-dir", str(tmp / "cache"), *argv], env=env or {})
        try:
            check_inputs(cfg)
        except UsageError as e:
            print(f"python -m training: error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        return cfg
    return run


def test_every_option_refuses_what_cannot_work(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    walk(_parser(TrainConfig()), cases(tmp_path), checked(tmp_path), capsys)


def test_every_variable_refuses_what_its_flag_refuses(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    checked_vars = 0
    for dest, own in cases(tmp_path).items():
        flag = "--" + dest.replace("_", "-")
        if dest == "data":  # a list of paths separated by ':' (below); '' = unset
            continue
        for argv, refusal in own:
            if refusal is None or len(argv) != 2 or argv[0] != flag or \
                    f"argument {flag}:" not in refusal:
                continue
            var = "EMBED_TRAIN_" + dest.upper()
            want = refusal.replace(f"argument {flag}:", f"{var}:")
            assert outcome(checked(tmp_path, {var: argv[1]}), [], capsys) == want, dest
            # Also when the flag overrides it: the environment still holds a mistake.
            good = next(a for a, r in own if r is None)
            assert outcome(checked(tmp_path, {var: argv[1]}), list(good), capsys) == want
            checked_vars += 1
    assert checked_vars >= 30
    check_all([([], f"{PROG}EMBED_TRAIN_COMPILE: must be 1 or 0 (true/false, yes/no, on/off), "
                    f"got 'sure' (see --help)")],
              checked(tmp_path, {"EMBED_TRAIN_COMPILE": "sure"}), capsys)
    check_all([([], f"{PROG}EMBED_TRAIN_DATA: must be a file, glob, directory or .jsonl file, "
                    f"got '' (see --help)")],
              checked(tmp_path, {"EMBED_TRAIN_DATA": "a.txt::b.txt"}), capsys)


def test_relations_between_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    check_all([
        (["--batch-size", "6", "--grad-accum", "4"],
         f"{PROG}--batch-size 6 is not divisible by --grad-accum 4 (see --help)"),
        (["--n-embd", "30", "--n-head", "4"],
         f"{PROG}--n-embd 30 is not divisible by --n-head 4 (see --help)"),
        (["--position", "none", "--n-embd", "12", "--n-head", "4"],
         f"{PROG}--position none (RoPE) needs an even head width: --n-embd 12 / --n-head 4 is "
         f"odd (see --help)"),
        (["--head-precision", "bf16", "--loss-chunk", "0"],
         f"{PROG}--head-precision bf16 needs the chunked loss: --loss-chunk > 0 (see --help)"),
        (["--tie-weights", "--sparse-embeddings"],
         f"{PROG}--sparse-embeddings needs an untied head (tied rows are all dense): drop "
         f"--tie-weights (see --help)"),
        (["--resume", "--resume-if-present"],
         f"{PROG}--resume and --resume-if-present cannot go together: --resume insists on the "
         f"state, --resume-if-present starts fresh without (see --help)"),
        (["--stop-at", "100", "--max-steps", "100"],
         f"{PROG}--stop-at 100 must be below --max-steps 100 (0 = run to the end) "
         f"(see --help)"),
        (["--checkpoint-every", "200"],
         f"{PROG}--checkpoint-every 200 must be below --max-steps 100 (0 = at the end) "
         f"(see --help)"),
        (["--no-export", "--out-repository", str(tmp_path)],
         f"{PROG}--out-repository needs --export: with --no-export nothing is written there "
         f"(see --help)"),
        (["--compile", "--compile-min-steps", "10"],
         f"{PROG}--compile-min-steps and --compile cannot go together: --compile compiles "
         f"whatever the run's length (see --help)"),
        (["--no-compile", "--compile-min-steps", "10", "--no-export", "--stop-at", "99"], None),
    ], checked(tmp_path), capsys)


def test_a_config_built_in_code_is_checked_by_the_same_rules() -> None:
    with pytest.raises(ValueError, match=r"^--lr: must be a number > 0, got '0'$"):
        TrainConfig(lr=0)
    with pytest.raises(ValueError, match=r"^--data: must be a file, glob, directory or "
                                         r"\.jsonl file, got ''$"):
        TrainConfig(data=("a.txt", ""))
    assert dataclasses.replace(TrainConfig(), lr=1e-4).lr == 1e-4


def test_default_model_options(tmp_path: Path, make_checkpoint: MakeCheckpoint,
                               capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m training.default_model``: its own option walked, then every other flag
    is python -m training's; those it sets itself are refused rather than overridden."""
    repo = tmp_path / "repo"
    make_checkpoint(repo, "tiny")
    (tmp_path / "file").write_text("")
    prog = "python -m training.default_model: error: "

    def run(argv: list[str]) -> int:
        code = default_model.main(argv)
        assert code == 0  # a valid model is there: nothing is trained
        return code

    walk(default_model._parser(), {"model_repository": [
        (["--model-repository", str(tmp_path / "no" / "m")],
         f"{prog}--model-repository {tmp_path / 'no' / 'm'}: the directory {tmp_path / 'no'} "
         f"does not exist; create it first (see --help)"),
        (["--model-repository", str(tmp_path / "file")],
         f"{prog}--model-repository {tmp_path / 'file'}: is a file, not a directory "
         f"(see --help)"),
        (["--model-repository", str(repo)], None)]}, run, capsys)
    set_here = ("set by this command (it exports model 'default' into --model-repository); "
                "run python -m training to choose it (see --help)")
    check_all([
        (["--model-repository", str(repo), "--name", "x"], f"{prog}--name: {set_here}"),
        (["--model-repository", str(repo), "--out-repository=x"],
         f"{prog}--out-repository: {set_here}"),
        (["--model-repository", str(repo), "--no-export"], f"{prog}--no-export: {set_here}"),
        (["--model-repository", str(repo), "--max-steps", "0"],
         f"{prog}argument --max-steps: must be a number of steps >= 1, got '0' (see --help)"),
        (["--bogus"], f"{prog}unrecognized arguments: --bogus (see --help)"),
    ], run, capsys)
    assert capsys.readouterr().out == ""


def test_a_bug_is_one_line_naming_its_log_and_the_machine_is_named(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import training.__main__ as entry

    cfg = checked(tmp_path)([])
    assert isinstance(cfg, TrainConfig)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "logs"))
    (tmp_path / "logs").mkdir()

    def bug(_: TrainConfig) -> None:
        raise ZeroDivisionError("integer modulo by zero")

    monkeypatch.setattr(entry, "run", bug)
    assert entry.execute(cfg) == 70
    (log,) = (tmp_path / "logs").iterdir()
    assert capsys.readouterr().err == (f"python -m training: internal error "
                                       f"(ZeroDivisionError); please report it with the log "
                                       f"{log}\n")
    assert "ZeroDivisionError: integer modulo by zero" in log.read_text()

    def full(_: TrainConfig) -> None:
        raise OSError(28, "No space left on device", str(tmp_path / "runs" / "x"))

    monkeypatch.setattr(entry, "run", full)
    assert entry.execute(cfg) == 1
    assert capsys.readouterr().err == (f"python -m training: {tmp_path / 'runs' / 'x'}: No "
                                       f"space left on device\n")
