"""Data preparation at scale: tokens/s and peak memory of training/data.py on a big corpus.

    .venv/bin/python -m training.bench.data [--size-mb 300] [--keep] [--dir DIR]
                                            [--out bench/results/data_bench.json]

Generates a synthetic corpus of ``--size-mb`` MB: paragraphs of CPython's
``pydoc_data.topics`` with ~15% of their words replaced by random words of the same text,
so BPE sees varied input rather than a few repeated strings. Two thirds go to ``.txt``
files, one third to a ``.jsonl`` file (documents of a few paragraphs, ``text`` field).

The real preparation (``training.data.load_tokens`` with the GPT-2 tokenizer) then runs
twice, each time in a fresh child process, so the child's peak RSS (``VmHWM``) is the
preparation's alone: the first run tokenizes, the second must find the shard in the
cache. The point of the figures is peak RSS << corpus size, and a second run that costs
only the content hash.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["generate_corpus", "main", "prepare_in_child", "vm_kib"]

_TXT_FILE_BYTES = 48 << 20  # text files of ~48 MB each: several inputs, each > 1 block
_SUBSTITUTE = 0.15  # fraction of words replaced per paragraph


def vm_kib(field: str) -> int:
    """A ``/proc/self/status`` figure in KiB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _paragraphs() -> list[list[str]]:
    from pydoc_data.topics import topics

    return [p.split(" ") for text in topics.values() for p in text.split("\n\n") if p.strip()]


def _varied(rng: random.Random, templates: list[list[str]], words: list[str]) -> str:
    words_out = list(rng.choice(templates))
    for i in rng.sample(range(len(words_out)), k=int(len(words_out) * _SUBSTITUTE)):
        words_out[i] = rng.choice(words)
    return " ".join(words_out)


def generate_corpus(root: Path, size_mb: float, seed: int = 0) -> list[Path]:
    """Write ~size_mb MB of .txt files and one .jsonl under root; return their paths."""
    rng = random.Random(seed)
    templates = _paragraphs()
    words = sorted({w for p in templates for w in p if w.strip()})
    total = int(size_mb * (1 << 20))
    txt_budget = total * 2 // 3
    root.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    written = 0
    while written < txt_budget:
        path = root / f"part{len(paths):03d}.txt"
        with path.open("w", encoding="utf-8") as f:
            n = 0
            while n < min(_TXT_FILE_BYTES, txt_budget - written):
                n += f.write(_varied(rng, templates, words) + "\n\n")
        written += path.stat().st_size
        paths.append(path)
    jsonl = root / "docs.jsonl"
    with jsonl.open("w", encoding="utf-8") as f:
        while written < total:
            doc = "\n\n".join(_varied(rng, templates, words) for _ in range(rng.randint(1, 8)))
            written += f.write(json.dumps({"id": written, "text": doc}) + "\n")
    paths.append(jsonl)
    return paths


def _child(cache_dir: str, sources: Sequence[str]) -> None:
    from service.format.tokenizer import default_ranks_path, gpt2_spec, load_tokenizer
    from training.data import load_tokens

    tokenizer = load_tokenizer(gpt2_spec(), default_ranks_path())
    rss_before = vm_kib("VmRSS")
    t0 = time.perf_counter()
    data = load_tokens(list(sources), tokenizer, Path(cache_dir), 0.01, progress=True)
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "tokens": len(data.train) + len(data.val),
                      "reused": data.reused, "shard_bytes": data.path.stat().st_size,
                      "dtype": data.train.dtype.name, "rss_before_kib": rss_before,
                      "peak_rss_kib": vm_kib("VmHWM")}))


def prepare_in_child(cache_dir: Path, sources: Sequence[Path]) -> dict[str, Any]:
    """Run load_tokens in a fresh interpreter; its timing, token count and peak RSS."""
    cmd = [sys.executable, "-m", "training.bench.data", "--child", str(cache_dir),
           *map(str, sources)]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _row(name: str, r: dict[str, Any], corpus_mb: float) -> str:
    peak = r["peak_rss_kib"] / 1024
    return (f"{name:<8} {r['seconds']:>9.2f} {r['tokens']:>13,} "
            f"{r['tokens'] / max(r['seconds'], 1e-9):>13,.0f} {peak:>10.1f} "
            f"{(r['peak_rss_kib'] - r['rss_before_kib']) / 1024:>10.1f} "
            f"{peak / corpus_mb:>8.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    """Generate, prepare twice, print the table, write the JSON."""
    ap = argparse.ArgumentParser(prog="python -m training.bench.data",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=300.0)
    ap.add_argument("--keep", action="store_true", help="keep the corpus and the cache")
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    ap.add_argument("--out", default="bench/results/data_bench.json")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1:])
        return 0
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="data_bench-"))
    try:
        t0 = time.perf_counter()
        sources = generate_corpus(work / "corpus", args.size_mb)
        gen_s = time.perf_counter() - t0
        corpus_bytes = sum(p.stat().st_size for p in sources)
        corpus_mb = corpus_bytes / (1 << 20)
        print(f"corpus: {corpus_mb:.1f} MB in {len(sources)} files "
              f"(generated in {gen_s:.1f} s) under {work}", flush=True)
        first = prepare_in_child(work / "cache", sources)
        second = prepare_in_child(work / "cache", sources)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'run':<8} {'seconds':>9} {'tokens':>13} {'tokens/s':>13} "
          f"{'peak MiB':>10} {'+prep MiB':>10} {'peak/corp':>8}")
    print(_row("first", first, corpus_mb))
    print(_row("second", second, corpus_mb))
    print(f"\ncorpus {corpus_mb:.1f} MiB; peak RSS {first['peak_rss_kib'] / 1024:.1f} MiB "
          f"({first['rss_before_kib'] / 1024:.1f} MiB before preparing: interpreter, "
          f"numpy, tokenizer); second run reused={second['reused']} "
          f"in {second['seconds']:.2f} s (content hash only)")
    report = {"corpus_bytes": corpus_bytes, "files": len(sources), "generate_seconds": gen_s,
              "first": first, "second": second, "cpus": len(os.sched_getaffinity(0)),
              "machine": platform.platform(), "python": platform.python_version()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
