"""``python -m service``'s options, each checked when parsed (service/config.py's RULES) or,
for what the filesystem must hold, by the start-up check before anything is bound; every
flag's EMBED_* variable by the same rule, naming the variable. The walk goes over the
parser's own options (tests/option_rules.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from service.config import RULES, ServerConfig, _parser, env_name, exit_with, parse_config
from service.preflight import StartupError, check_config
from tests.option_rules import Case, Cases, OneEach, check_all, one_each, outcome, walk

PROG = "python -m service: error: "


def bad(flag: str, value: str, accepts: str) -> Case:
    return ([flag, value], f"{PROG}argument {flag}: must be {accepts}, got {value!r} "
                           f"(see --help)")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.pem; server.pem/key signed by it; other.key (another key); locked.pem/key (an
    encrypted key)."""
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.pem", "-days", "2", "-subj", "/CN=ca", cwd=d)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
             "server.pem", "-days", "2", "-subj", "/CN=localhost", cwd=d)
    _openssl("genrsa", "-out", "other.key", "2048", cwd=d)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-keyout", "locked.key", "-out",
             "locked.pem", "-days", "2", "-subj", "/CN=x", "-passout", "pass:secret", cwd=d)
    return d


# What three options each accept, and what is too long for a row.
TOKENS = "a number of tokens >= 1"
BYTES = "a size in bytes >= 1"
COUNT = "an integer >= 1"
TOKEN_TEXT = "a token of visible ASCII characters, without spaces or line breaks ('' = none)"
OTLP_URL = "'' (off) or a collector URL, http://host:port or https://host:port"
# The options one refused and one accepted value show: (option, a refused value, what the
# option accepts, an accepted value).
ONE_EACH: list[OneEach] = [
    ("--table-dtype", "fp16", "one of stored, float32, float16, bfloat16", "bfloat16"),
    ("--max-batch-tokens", "0", TOKENS, "1"),
    ("--max-batch-delay-us", "-5", "a number of microseconds >= 0", "0"),
    ("--max-queue-tokens", "0", TOKENS, "16384"),
    ("--max-tokens-per-request", "1e3", TOKENS, "1000"),
    ("--max-text-bytes", "0", BYTES, "1"),
    ("--max-message-bytes", "2147483648", "a size in bytes in [1, 2147483647]", "2147483647"),
    ("--max-output-bytes", "-1", "a size in bytes >= 0 (0 = --max-message-bytes)", "0"),
    ("--poll-seconds", "nan", "a number of seconds >= 0 (0 = no hot reload)", "0.5"),
    ("--load-grace-seconds", "-1", "a number of seconds >= 0", "0"),
    ("--shutdown-grace-seconds", "inf", "a number of seconds >= 0", "2.5"),
    ("--auth-token", "s3cret\n", TOKEN_TEXT, "s3cret"),
    ("--log-format", "JSON", "one of json, text", "json"),
    ("--tokenize-threads", "-1", "an integer >= 0 (0 = one per core)", "0"),
    ("--torch-threads", "two", "an integer >= 0 (0 = torch's default)", "2"),
    ("--max-inputs-per-request", "0", COUNT, "1"),
    ("--max-request-text-bytes", "0", BYTES, "100"),
    ("--max-concurrent-rpcs", "-1", "an integer >= 0 (0 = no cap)", "0"),
    ("--max-stream-buffer-bytes", "0", BYTES, "4096"),
    ("--max-unsent-bytes", "-1", "a size in bytes >= 0 (0 = no cap)", "0"),
    ("--otlp-endpoint", "otel-collector:4317", OTLP_URL, "http://otel-collector:4317"),
    ("--trace-sample-ratio", "1.5", "a number in [0, 1]", "0.25"),
    ("--max-shm-regions-per-identity", "0", COUNT, "1"),
    ("--max-shm-regions", "0", COUNT, "16"),
]


def cases(tmp: Path, tls: Path) -> Cases:
    server = ["--tls-cert", str(tls / "server.pem"), "--tls-key", str(tls / "server.key")]
    pem = tmp / "a.pem"
    pem.write_text("x")
    tokens, latin1 = tmp / "tokens.txt", tmp / "latin1.txt"
    tokens.write_text("# name token\nalice s3cret\nbob t0ken\n")
    latin1.write_bytes(b"alice caf\xe9\n")
    name = "a model name: letters, digits, '.', '_' or '-', starting with a letter or digit"
    port = "a port 1..65535 (0 picks a free port"
    return {
        **one_each(bad, ONE_EACH),
        "model_repository": [
            (["--model-repository", str(tmp / "no")], f"{PROG}--model-repository "
             f"{tmp / 'no'}: does not exist; create it (an empty one is served once a version "
             f"appears) or point --model-repository / EMBED_MODEL_REPOSITORY at the "
             f"directory holding <model>/<version>/"),
            (["--model-repository", str(pem)], f"{PROG}--model-repository {pem}: is not a "
             f"directory; create it (an empty one is served once a version appears) or point "
             f"--model-repository / EMBED_MODEL_REPOSITORY at the directory holding "
             f"<model>/<version>/"),
            (["--model-repository", str(tmp)], None)],
        "default_model": [
            bad("--default-model", "a/b", f"{name} ('' = the first loaded name in sorted "
                "order)"),
            (["--default-model", ""], None)],
        "pin_versions": [
            (["--pin-versions", "tiny=01x"], f"{PROG}argument --pin-versions: 'tiny=01x' is "
             f"not <model>=<version> with a model name and a positive version, e.g. "
             f"tiny=3,other=1 (see --help)"),
            (["--pin-versions", ".tmp=1"], f"{PROG}argument --pin-versions: '.tmp=1' is not "
             f"<model>=<version> with a model name and a positive version, e.g. "
             f"tiny=3,other=1 (see --help)"),
            (["--pin-versions", " tiny=3 , other=1"], None)],
        "host": [
            bad("--host", "127.0.0.1:50051", "a host name or an address of this machine "
                "(127.0.0.1, 0.0.0.0, ::), without a port"),
            bad("--host", "", "a host name or an address of this machine (127.0.0.1, "
                "0.0.0.0, ::), without a port"),
            (["--host", "::"], None), (["--host", "[::1]"], None),
            (["--host", "0.0.0.0"], None)],
        "grpc_port": [bad("--grpc-port", "-1", f"{port})"),
                      bad("--grpc-port", "65536", f"{port})"), (["--grpc-port", "0"], None)],
        "metrics_port": [bad("--metrics-port", "-2", f"{port}, -1 off)"),
                         (["--metrics-port", "-1"], None)],
        "http_port": [bad("--http-port", "8o00", f"{port}, -1 off)"),
                      (["--http-port", "8001"], None)],
        "device": [bad("--device", "cuda:x", "auto, cpu, cuda or cuda:N"),
                   bad("--device", "GPU", "auto, cpu, cuda or cuda:N"),
                   (["--device", "cuda:1"], None)],
        "tls_cert": [(["--tls-cert", str(tmp / "c.pem"), "--tls-key", str(pem)],
                      f"{PROG}--tls-cert {tmp / 'c.pem'}: no such file"),
                     (["--tls-cert", str(pem), "--tls-key", str(pem)],
                      f"{PROG}--tls-cert {pem} and --tls-key {pem}: not a PEM certificate "
                      f"chain and its private key; give a certificate and the key it was made "
                      f"with"),
                     (["--tls-cert", str(tls / "server.pem"), "--tls-key",
                       str(tls / "other.key")],
                      f"{PROG}--tls-cert {tls / 'server.pem'} and --tls-key "
                      f"{tls / 'other.key'}: the key does not belong to the certificate; give "
                      f"a certificate and the key it was made with"),
                     (server, None)],
        "tls_key": [(["--tls-cert", str(tls / "server.pem"), "--tls-key", str(tmp)],
                     f"{PROG}--tls-key {tmp}: is a directory, not a file"),
                    (["--tls-cert", str(tls / "locked.pem"), "--tls-key",
                      str(tls / "locked.key")],
                     f"{PROG}--tls-key {tls / 'locked.key'}: the key is encrypted; give an "
                     f"unencrypted key (gRPC cannot ask for its passphrase)"),
                    (server, None)],
        "tls_client_ca": [([*server, "--tls-client-ca", str(tmp / "ca.pem")],
                           f"{PROG}--tls-client-ca {tmp / 'ca.pem'}: no such file"),
                          ([*server, "--tls-client-ca", str(pem)],
                           f"{PROG}--tls-client-ca {pem}: not PEM CA certificates "
                           f"(NO_CERTIFICATE_OR_CRL_FOUND)"),
                          ([*server, "--tls-client-ca", str(tls / "ca.pem")], None)],
        "workers": [bad("--workers", "0", "a number of processes >= 1"),
                    (["--workers", "2", "--http-port", "-1"], None)],
        "ui": [(["--ui=1"], f"{PROG}argument --ui/--no-ui: ignored explicit argument '1' "
                            f"(see --help)"), (["--no-ui"], None)],
        "auth_tokens": [(["--auth-tokens", str(tmp / "tokens")],
                         f"{PROG}--auth-tokens {tmp / 'tokens'}: no such file"),
                        (["--auth-tokens", str(pem)],
                         f"{PROG}--auth-tokens {pem}:1: expected 'name token'"),
                        (["--auth-tokens", str(latin1)],
                         f"{PROG}--auth-tokens {latin1}: not UTF-8 text (byte 9)"),
                        (["--auth-tokens", str(tokens)], None)],
        "shm_allow_remote": [(["--shm-allow-remote=yes"], f"{PROG}argument "
                              f"--shm-allow-remote/--no-shm-allow-remote: ignored explicit "
                              f"argument 'yes' (see --help)"),
                             (["--shm-allow-remote"], None)],
    }


def starts(tmp: Path, environ: dict[str, str] | None = None) -> object:
    """parse_config, then the start-up check of the repository and files (no ports, no
    device: those need the machine, tests/service/test_startup.py runs them)."""
    def run(argv: list[str]) -> ServerConfig:
        config = parse_config(["--model-repository", str(tmp), *argv], environ=environ or {})
        try:
            check_config(config)
        except StartupError as e:
            exit_with(str(e))
        return config
    return run


def test_every_option_refuses_what_cannot_work(tmp_path: Path, tls: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    walk(_parser(), cases(tmp_path, tls), starts(tmp_path), capsys)


def test_every_variable_refuses_what_its_flag_refuses(tmp_path: Path, tls: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """Each refused flag value, given as the flag's EMBED_* variable instead: the same
    refusal, naming the variable."""
    checked = 0
    for dest, own in cases(tmp_path, tls).items():
        for argv, refusal in own:
            flag = "--" + dest.replace("_", "-")
            if refusal is None or len(argv) != 2 or argv[0] != flag or \
                    f"argument {flag}:" not in refusal:
                continue
            run = starts(tmp_path, {env_name(dest): argv[1]})
            want = refusal.replace(f"argument {flag}:", f"{env_name(dest)}:")
            assert outcome(run, [], capsys) == want, dest
            checked += 1
    assert checked >= len(RULES) - 10  # the file options and switches are checked apart
    check_all([([], f"{PROG}EMBED_UI: must be 1 or 0 (true/false, yes/no, on/off), got "
                    f"'maybe' (see --help)")], starts(tmp_path, {"EMBED_UI": "maybe"}), capsys)
    assert starts(tmp_path, {"EMBED_UI": "off", "EMBED_GRPC_PORT": "7"})(
        ["--grpc-port", "8"]).__dict__["grpc_port"] == 8  # the flag wins
    # A variable's file is checked where the flag's is.
    check_all([([], f"{PROG}--tls-cert {tmp_path / 'x'}: no such file")],
              starts(tmp_path, {"EMBED_TLS_CERT": str(tmp_path / "x"),
                                "EMBED_TLS_KEY": str(tmp_path / "x")}), capsys)


def test_relations_between_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pem = tmp_path / "a.pem"
    pem.write_text("x")
    check_all([
        (["--max-batch-tokens", "100", "--max-queue-tokens", "99"],
         f"{PROG}--max-batch-tokens 100 and --max-queue-tokens 99: need --max-batch-tokens "
         f"<= --max-queue-tokens (see --help)"),
        (["--tls-cert", str(pem)],
         f"{PROG}--tls-cert and --tls-key go together: give both or neither (see --help)"),
        (["--tls-client-ca", str(pem)],
         f"{PROG}--tls-client-ca needs --tls-cert and --tls-key (TLS on) (see --help)"),
        (["--max-shm-regions-per-identity", "17", "--max-shm-regions", "16"],
         f"{PROG}need --max-shm-regions-per-identity <= --max-shm-regions (see --help)"),
        (["--ui", "--http-port", "-1"],
         f"{PROG}--ui needs the HTTP port: --http-port is -1 (off) (see --help)"),
        (["--no-ui", "--http-port", "-1"], None),
        (["--workers", "3", "--metrics-port", "65534", "--http-port", "-1"],
         f"{PROG}--metrics-port 65534: worker 2 would use 65536, past 65535 (see --help)"),
        (["--workers", "2", "--grpc-port", "0"],
         f"{PROG}--workers > 1 needs a fixed --grpc-port (0 would differ per worker) "
         f"(see --help)"),
        (["--workers", "2", "--http-port", "0"],
         f"{PROG}--workers > 1 needs a fixed --http-port, or -1 for no HTTP (0 would differ "
         f"per worker) (see --help)"),
        (["--grpc-port", "9000", "--metrics-port", "8999", "--workers", "2",
          "--http-port", "-1"],
         f"{PROG}--metrics-port 9000: the same port as --grpc-port; each listener needs its "
         f"own port (see --help)"),
    ], starts(tmp_path), capsys)


def test_a_config_built_in_code_is_checked_by_the_same_rules() -> None:
    with pytest.raises(ValueError, match=r"^--workers: must be a number of processes >= 1, "
                                         r"got '0'$"):
        ServerConfig(workers=0)
    with pytest.raises(ValueError, match=r"^--poll-seconds: must be a number of seconds >= 0 "
                                         r"\(0 = no hot reload\), got 'nan'$"):
        ServerConfig(poll_seconds=float("nan"))


def test_a_bug_before_logging_is_one_line_naming_its_log(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import service.__main__ as entry

    def broken(argv: object) -> None:
        raise KeyError("port")

    monkeypatch.setattr(entry, "parse_config", broken)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with pytest.raises(SystemExit) as e:
        entry.main([])
    assert e.value.code == 70
    err = capsys.readouterr().err
    (log,) = tmp_path.iterdir()
    assert err == (f"python -m service: internal error (KeyError); please report it with the "
                   f"log {log}\n")
    assert "KeyError: 'port'" in log.read_text()


def test_help_says_what_the_server_does() -> None:
    """--help as the code behaves: the workers share one sealed copy of the tables
    (format/shared_tables.py), a stored bf16 table is read into memory, not mapped
    (format/tensorfile.py), and no help cites a measured figure that would go stale."""
    helps = {a.dest: a.help or "" for a in _parser()._actions}
    assert helps["workers"] == (
        "server processes sharing the ports (SO_REUSEPORT); the tables present at start are "
        "read once and every worker maps that one sealed copy (a version loaded later is "
        "read by each worker); needs fixed --grpc-port and --http-port (env EMBED_WORKERS; "
        "default 1)")
    assert helps["table_dtype"] == (
        "dtype the tables are held in on the device: stored keeps the checkpoint's (a bf16 "
        "table stays bf16 in memory, half the bytes of float32, and its rows are widened as "
        "gathered), or float32, float16, bfloat16 (converted at load); the position add is "
        "always fp32 (env EMBED_TABLE_DTYPE; default 'stored')")
    assert helps["torch_threads"] == (
        "torch intra-op threads for CPU lookups; parallelism comes from batching and gRPC's "
        "threads, so more threads here compete with them for the cores; 0 = torch's default "
        "(env EMBED_TORCH_THREADS; default 1)")
    for dest, text in helps.items():
        assert "measured" not in text, dest
        assert "memory map" not in text, dest
