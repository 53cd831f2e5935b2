"""embedctl's options, each checked when parsed: a value that cannot work is exit status 2
and one line naming the option and what it accepts, before any connection; the walk goes
over the parser's own options (tests/option_rules.py)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from client.cli import RULES, build_parser, main, parse_args, save_array
from client.flags import actions
from tests.option_rules import Cases, check_all, walk

TARGET_FORM = "host:port (port 1..65535), [IPv6]:port, dns:///host:port or unix:PATH"
NAME = ("a model name: letters, digits, '.', '_' or '-', starting with a letter or digit "
        "('' = the server's default model)")


def top(message: str) -> str:
    return f"embedctl: error: {message} (see --help)"


def cases(tmp: Path, certs: Path) -> Cases:
    pem = tmp / "a.pem"
    pem.write_text("x")
    cert, key = str(certs / "client.pem"), str(certs / "client.key")
    (tmp / "dir.npy").mkdir(exist_ok=True)
    return {
        "target": [
            (["--target", "http://127.0.0.1:50051", "models"],
             top(f"argument --target: must be {TARGET_FORM}, got 'http://127.0.0.1:50051'")),
            (["--target", "127.0.0.1:0", "models"],
             top(f"argument --target: must be {TARGET_FORM}, got '127.0.0.1:0'")),
            (["--target", "svc", "models"], top(f"argument --target: must be {TARGET_FORM}, "
                                                f"got 'svc'")),
            (["--target", "[::1]:50051", "models"], None),
            (["--target", "unix:/run/embed.sock", "models"], None)],
        "timeout": [
            (["--timeout", "0", "models"],
             top("argument --timeout: must be a number of seconds > 0, got '0'")),
            (["--timeout", "inf", "models"],
             top("argument --timeout: must be a number of seconds > 0, got 'inf'")),
            (["--timeout", "0.5", "models"], None)],
        "token": [
            (["--token", "abc\n", "models"],
             top("argument --token: must be a token of visible ASCII characters, without "
                 "spaces or line breaks ('' = none), got 'abc\\n'")),
            (["--token", "s3cret-Token_1", "models"], None)],
        "tls": [(["--tls=yes", "models"],
                 top("argument --tls: ignored explicit argument 'yes'")),
                (["--tls", "models"], None)],
        "tls_ca": [(["--tls-ca", str(tmp / "none.pem"), "models"],
                    top(f"--tls-ca {tmp / 'none.pem'}: no such file")),
                   (["--tls-ca", str(tmp), "models"],
                    top(f"--tls-ca {tmp}: is a directory, not a file")),
                   (["--tls-ca", str(pem), "models"],
                    top(f"--tls-ca {pem}: not PEM CA certificates "
                        f"(NO_CERTIFICATE_OR_CRL_FOUND)")),
                   (["--tls-ca", str(certs / "ca.pem"), "models"], None)],
        "tls_cert": [(["--tls-cert", str(tmp), "--tls-key", key, "models"],
                      top(f"--tls-cert {tmp}: is a directory, not a file")),
                     (["--tls-cert", str(pem), "--tls-key", key, "models"],
                      top(f"--tls-cert {pem} and --tls-key {key}: not a PEM certificate chain "
                          f"and its private key; give a certificate and the key it was made "
                          f"with")),
                     (["--tls-cert", cert, "--tls-key", key, "models"], None)],
        "tls_key": [(["--tls-cert", cert, "--tls-key", str(tmp / "k"), "models"],
                     top(f"--tls-key {tmp / 'k'}: no such file")),
                    (["--tls-cert", cert, "--tls-key", str(certs / "server.key"), "models"],
                     top(f"--tls-cert {cert} and --tls-key {certs / 'server.key'}: the key does "
                         f"not belong to the certificate; give a certificate and the key it "
                         f"was made with")),
                    (["--tls-cert", cert, "--tls-key", key, "models"], None)],
        "model": [(["info", "--model", "../etc"],
                   top(f"argument --model: must be {NAME}, got '../etc'")),
                  (["info", "--model", ".hidden"],
                   top(f"argument --model: must be {NAME}, got '.hidden'")),
                  (["info", "--model", "Llama-3.2-1B"], None), (["info", "--model", ""], None)],
        "version": [(["info", "--version", "-1"], top(
            "argument --version: must be an integer in [0, 9007199254740991] (0 = the "
            "newest loaded), got '-1'")),
                    (["info", "--version", "1.5"], top(
            "argument --version: must be an integer in [0, 9007199254740991] (0 = the "
            "newest loaded), got '1.5'")),
                    (["info", "--version", "3"], None)],
        "text": [(["embed", ""], top("argument TEXT: must be non-empty text, got ''")),
                 (["tokenize", ""], top("argument TEXT: must be non-empty text, got ''")),
                 (["tokenize", " "], None)],
        "ids": [(["embed", "--ids", "1,,2"], top(
            "argument --ids: item 2 of the token ids is empty: give integers "
            "separated by commas, e.g. 1,2,3")),
                (["detokenize", "1 2"], top(
            "argument IDS: item 1 of the token ids, '1 2', is not an integer: "
            "give integers separated by commas, e.g. 1,2,3")),
                (["embed", "--ids", "1, 2"], None)],
        "start_position": [
            (["embed", "a", "--start-position", "4294967296"], top(
                "argument --start-position: must be an integer in [0, 4294967295], "
                "got '4294967296'")),
            (["embed", "a", "--start-position", "4294967295"], None)],
        "compose": [(["embed", "a", "--compose", "Token"], top(
            "argument --compose: compose 'Token': expected one of token+position, "
            "token_plus_position, COMPOSE_TOKEN_PLUS_POSITION, token, token_only, "
            "COMPOSE_TOKEN_ONLY, position, position_only, COMPOSE_POSITION_ONLY")),
                    (["embed", "a", "--compose", "token_only"], None)],
        "dtype": [(["embed", "a", "--dtype", "fp16"], top(
            "argument --dtype: dtype 'fp16': expected one of float32, FP32, "
            "DTYPE_FLOAT32, float16, FP16, DTYPE_FLOAT16, bfloat16, BF16, DTYPE_BFLOAT16")),
                  (["embed", "a", "--dtype", "BF16"], None)],
        "truncate": [(["embed", "a", "--truncate", "LEFT"], top(
            "argument --truncate: truncate 'LEFT': expected one of none, "
            "TRUNCATE_NONE, right, TRUNCATE_RIGHT, left, TRUNCATE_LEFT")),
                     (["embed", "a", "--truncate", "left"], None)],
        "add_special_tokens": [
            (["embed", "a", "--add-special-tokens=1"],
             top("argument --add-special-tokens/--no-add-special-tokens: "
                 "ignored explicit argument '1'")),
            (["embed", "a", "--no-add-special-tokens"], None)],
        "allow_special_tokens": [
            (["tokenize", "a", "--allow-special-tokens=no"], top(
                "argument --allow-special-tokens: ignored explicit argument 'no'")),
            (["tokenize", "a", "--allow-special-tokens"], None)],
        "out": [(["embed", "a", "--out", str(tmp / "x")], top(
            f"argument --out: must be a file path ending in .npy, got '{tmp / 'x'}'")),
                (["embed", "a", "--out", str(tmp / "no" / "x.npy")],
                 top(f"--out {tmp / 'no' / 'x.npy'}: the directory {tmp / 'no'} does not "
                     f"exist; create it first")),
                (["embed", "a", "--out", str(tmp / "dir.npy")],
                 top(f"--out {tmp / 'dir.npy'}: is a directory; name the file to write")),
                (["embed", "a", "--out", str(tmp / "x.NPY")], None)],
        "shm": [(["embed", "a", "--shm=1"],
                 top("argument --shm: ignored explicit argument '1'")),
                (["embed", "a", "--shm"], None)],
        "shm_bytes": [(["embed", "a", "--shm", "--shm-bytes", "0"], top(
            "argument --shm-bytes: must be a size in bytes >= 1, got '0'")),
                      (["embed", "a", "--shm", "--shm-bytes", "4096"], None)],
    }


def parse(argv: list[str]) -> object:
    return parse_args(argv, environ={})


def test_every_option_refuses_what_cannot_work(tmp_path: Path, certs: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    walk(build_parser(), cases(tmp_path, certs), parse, capsys)
    assert set(RULES) == {a.dest for a in actions(build_parser())}


def test_relations_between_options(tmp_path: Path, certs: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    pem = tmp_path / "a.pem"
    pem.write_text("x")
    cert, key = str(certs / "client.pem"), str(certs / "client.key")
    text_only = ("special tokens are a matter of tokenizing text; ids are sent as given")
    check_all([
        (["embed"], top("give exactly one of TEXT or --ids")),
        (["embed", "a", "--ids", "1"], top("give exactly one of TEXT or --ids")),
        (["embed", "--ids", "1", "--allow-special-tokens"],
         top(f"--allow-special-tokens and --ids cannot go together: {text_only}")),
        (["embed", "--ids", "1", "--no-add-special-tokens"],
         top(f"--add-special-tokens and --ids cannot go together: {text_only}")),
        (["embed", "a", "--allow-special-tokens", "--add-special-tokens"], None),
        (["embed", "a", "--shm-bytes", "4096"],
         top("--shm-bytes needs --shm: it sizes the shared-memory region")),
        (["--tls-cert", str(pem), "models"],
         top("--tls-cert needs --tls-key: mutual TLS takes the certificate and its key")),
        (["--tls-key", str(pem), "models"],
         top("--tls-key needs --tls-cert: mutual TLS takes the certificate and its key")),
        (["--tls", "--tls-ca", str(pem), "models"],
         top("--tls and --tls-ca cannot go together: --tls trusts the system roots, --tls-ca "
             "only the given ones (and implies TLS)")),
        (["--tls", "--tls-cert", cert, "--tls-key", key, "models"], None),
        (["models", "--model", "x"], top("unrecognized arguments: --model x")),
    ], parse, capsys)


def test_environment_variables_are_checked_and_named(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    def with_env(env: dict[str, str]) -> object:
        return lambda argv: parse_args(argv, environ=env)

    check_all([(["models"], top(f"EMBED_TARGET: must be {TARGET_FORM}, got 'svc:'"))],
              with_env({"EMBED_TARGET": "svc:"}), capsys)
    check_all([(["models"], top("EMBED_TOKEN: must be a token of visible ASCII characters, "
                                "without spaces or line breaks ('' = none), got 't t'"))],
              with_env({"EMBED_TOKEN": "t t"}), capsys)
    args = parse_args(["--target", "h:1", "models"], environ={"EMBED_TARGET": "svc:443",
                                                               "EMBED_TOKEN": "tok"})
    assert (args.target, args.token) == ("h:1", "tok")  # the flag wins over the variable
    assert parse_args(["models"], environ={}).target == "127.0.0.1:50051"


def test_a_refusal_comes_before_any_connection(tmp_path: Path) -> None:
    """Nothing listens at the target: a bad option is still exit 2, the option's line."""
    with pytest.raises(SystemExit) as e:
        main(["--target", "127.0.0.1:1", "embed", "a", "--out", str(tmp_path / "a" / "x.npy")])
    assert e.value.code == 2


def test_out_is_written_at_exactly_that_path(tmp_path: Path) -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    path = tmp_path / "rows.NPY"  # np.save(name) would have written rows.NPY.npy
    save_array(path, array)
    assert sorted(os.listdir(tmp_path)) == ["rows.NPY"]
    assert np.array_equal(np.load(path), array)
    (tmp_path / "d.npy").mkdir()
    with pytest.raises(IsADirectoryError):
        save_array(tmp_path / "d.npy", array)
    assert sorted(os.listdir(tmp_path)) == ["d.npy", "rows.NPY"]  # no temporary file left
