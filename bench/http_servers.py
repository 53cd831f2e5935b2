"""The two reference servers of ``bench.http``: the ceiling and the floor (see there).

    python -m bench.http_servers ceiling|floor PORT RESPONSES_DIR MODEL_REPOSITORY

Each prints "<side> ready" once listening, and serves until killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.http import MODEL, C, cell_ids, cells

__all__ = ["main", "run_ceiling", "run_floor", "serve_forever"]


def _prebuilt(responses: Path) -> dict[str, tuple[bytes, dict[str, str]]]:
    out = {}
    for meta in responses.glob("*.json"):
        headers = json.loads(meta.read_text())
        out["/" + meta.stem] = (meta.with_suffix(".bin").read_bytes(), headers)
    return out


def serve_forever(port: int, handle: Any, ready: str) -> None:
    """``handle`` on an aiohttp low-level server on 127.0.0.1:``port``; prints ``ready``
    once listening, then serves until killed."""
    async def serve() -> None:
        server = web.Server(handle, access_log=None)
        await asyncio.get_running_loop().create_server(server, "127.0.0.1", port)
        print(ready, flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


def run_ceiling(port: int, responses: Path) -> None:
    """Serve each captured response at /<cell name> on ``port`` until killed."""
    prebuilt = _prebuilt(responses)

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        await request.read()  # the request is read, as the service reads it
        body, headers = prebuilt[request.path]
        return web.Response(body=body, headers=headers)

    serve_forever(port, handle, "ceiling ready")


def run_floor(port: int, responses: Path, repo: Path) -> None:
    """The ceiling's server plus the one piece of work no implementation can skip: each
    request's rows looked up (the service's own tables and ``embed_into``, on the loop)
    into a fresh response body (``codec.ResponseWriter``, as the service allocates it).
    No parsing, admission, batching or frame. Binary cells only; each body is checked
    once against the service's captured response, byte for byte."""
    import torch
    from service.rpc.codec import ResponseWriter

    from service.engine.batcher import Timing
    from service.engine.loading import load_model

    torch.set_num_threads(1)  # the service's default
    tables = load_model(MODEL, repo / MODEL / "1", torch.device("cpu"), torch.float32).tables
    wire = {"FP32": torch.float32, "BF16": torch.bfloat16}
    plans: dict[str, tuple[torch.Tensor, bytes, bytes, torch.dtype, dict[str, str]]] = {}
    for path, (body, headers) in _prebuilt(responses).items():
        cell = next((c for c in cells() if "/" + c.name == path), None)
        if cell is None or cell.output != "binary":
            continue
        head = int(headers["Inference-Header-Content-Length"])
        nbytes = cell.T * C * wire[cell.datatype].itemsize
        plans[path] = (torch.tensor(cell_ids(cell.T)), body[:head],
                       body[head + nbytes:], wire[cell.datatype], headers)

    def lookup(path: str) -> bytes:
        ids, prefix, suffix, dtype, _ = plans[path]
        T = int(ids.shape[0])
        writer = ResponseWriter(prefix, (T, C), dtype, suffix, None)
        tables.embed_into([(ids, [(0, T)], writer.rows)], 0)  # token + position rows
        return writer.finish(Timing(0, 0, 0, 0))

    for path, (body, _) in _prebuilt(responses).items():
        if path in plans and lookup(path) != body:
            raise SystemExit(f"floor: {path} differs from the service's response")

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        await request.read()
        return web.Response(body=lookup(request.path), headers=plans[request.path][4])

    serve_forever(port, handle, "floor ready")


def main(argv: list[str] | None = None) -> None:
    """Run one side: ``ceiling|floor PORT RESPONSES_DIR MODEL_REPOSITORY``."""
    side, port, responses, repo = (argv if argv is not None else sys.argv[1:])
    if side == "ceiling":
        run_ceiling(int(port), Path(responses))
    else:
        run_floor(int(port), Path(responses), Path(repo))


if __name__ == "__main__":
    main()
