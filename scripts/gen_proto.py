"""Generate the Python gRPC code from proto/ into genproto (``make proto``).

One generated package, imported by both the server and the client. grpc_tools emits
absolute imports rooted at the proto path (``from embedding.v1 import ...``); we rewrite
them to the package they live in, so nothing has to be put on sys.path. ``--check``
regenerates into a temporary folder and fails if the committed code is stale.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from client import flags

__all__ = ["RULES", "build_parser", "generate", "main"]

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT = ROOT / "genproto"
PACKAGE = "genproto"


def generate(out: Path) -> list[Path]:
    """Run protoc for every .proto under proto/ into ``out``; return the files written."""
    from grpc_tools import protoc  # dev dependency, only needed here

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    out.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out}",
            f"--pyi_out={out}", f"--grpc_python_out={out}", *protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    written = []
    for path in sorted(out.rglob("*.py*")):
        text = path.read_text()
        for proto in protos:
            pkg = ".".join(Path(proto).parent.parts)
            text = text.replace(f"from {pkg} import", f"from {PACKAGE}.{pkg} import")
        path.write_text(text)
        written.append(path)
    for folder in [out, *[p for p in out.rglob("*") if p.is_dir()]]:
        (folder / "__init__.py").touch()
    return written


RULES = {"check": flags.SWITCH}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (an unknown option is refused, never taken as 'regenerate')."""
    parser = flags.OneLineParser(prog="scripts/gen_proto.py", description="Generate genproto/ "
                                 "from proto/ (make proto).")
    parser.add_argument("--check", action="store_true", help="regenerate into a temporary "
                        "folder and fail if the committed genproto/ differs (make check)")
    flags.install(parser, RULES)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """``gen_proto.py`` regenerates; ``gen_proto.py --check`` fails if genproto is stale."""
    if not flags.parse(build_parser(), RULES, argv).check:
        shutil.rmtree(OUT, ignore_errors=True)
        generate(OUT)
        print(f"proto: generated {OUT.relative_to(ROOT)}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "_gen"
        generate(fresh)
        stale = [str(p.relative_to(fresh)) for p in fresh.rglob("*") if p.is_file()
                 and not ((OUT / p.relative_to(fresh)).exists()
                          and filecmp.cmp(p, OUT / p.relative_to(fresh), shallow=False))]
        if stale:
            raise SystemExit(f"proto: genproto is stale ({', '.join(stale)}); run `make proto`")
        print("proto: genproto is up to date")


if __name__ == "__main__":
    main()
