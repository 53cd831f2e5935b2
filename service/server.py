"""The server's lifecycle: load, serve, hot-reload, drain.

Health is NOT_SERVING until a model is loaded. On SIGTERM: NOT_SERVING at once (load
balancers stop sending), new RPCs get UNAVAILABLE, in-flight RPCs get
``shutdown_grace_seconds`` to finish, then the process exits 0.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service import tracing
from service.config import ServerConfig, parse_pins
from service.dtypes import BY_NAME
from service.engine.batcher import Batcher
from service.engine.budgets import StreamBudgets
from service.engine.cuda_shm import CudaSharedMemoryRegistry
from service.engine.engine import Engine
from service.engine.loading import LoadedModel
from service.engine.repository import Repository
from service.engine.shm import SharedMemoryRegistry
from service.engine.tables import resolve_device
from service.engine.validation import Limits
from service.metrics import Metrics
from service.preflight import StartupError, bind_refusal
from service.rpc.frame import Frame
from service.rpc.http import HttpFront, server_ssl_context
from service.rpc.identity import Identities
from service.rpc.native import SERVICE_NAME, NativeFront
from service.rpc.oip import OIP_SERVICE_NAME, OipFront
from service.rpc.reflection import ReflectionPool

__all__ = ["EmbeddingServer", "serve"]

log = logging.getLogger("service.server")


class EmbeddingServer:
    """Owns the repository, batcher, metrics, gRPC server and health state."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        if config.torch_threads > 0 and self.device.type == "cpu":
            torch.set_num_threads(config.torch_threads)
        self.metrics = Metrics(counting=config.metrics_port >= 0)  # -1: off, never counted
        self.repo = Repository(config.model_repository, self.device,
                               None if config.table_dtype == "stored"
                               else BY_NAME[config.table_dtype].torch, config.default_model,
                               parse_pins(config.pin_versions), self._on_load,
                               # with no next poll a failing version cannot be "not ready yet"
                               config.load_grace_seconds if config.poll_seconds > 0 else 0.0)
        self.batcher = Batcher(config.max_batch_tokens, config.max_batch_delay_us,
                               config.max_queue_tokens,
                               self.metrics.observe_batch if self.metrics.counting else None)
        self.metrics.queue_tokens.set_function(lambda: self.batcher.queued_tokens)
        threads = config.tokenize_threads or (os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="embed-tokenize")
        self.engine = Engine(
            self.repo, self.batcher, self.metrics,
            Limits(config.max_tokens_per_request, config.max_text_bytes,
                   config.max_message_bytes, config.max_output_bytes,
                   config.max_inputs_per_request, config.max_request_text_bytes), self._pool,
            shm := SharedMemoryRegistry(allow_remote=config.shm_allow_remote,
                                        max_per_identity=config.max_shm_regions_per_identity,
                                        max_regions=config.max_shm_regions),
            CudaSharedMemoryRegistry(self.device, shm, config.shm_allow_remote,
                                     config.max_shm_regions_per_identity,
                                     config.max_shm_regions))
        # One frame and one engine for every front: the same auth, limits, batches, regions.
        self.frame = Frame(self.engine, identities=Identities(
            config.auth_token, config.auth_tokens, tls_subject=bool(config.tls_client_ca)))
        budgets = StreamBudgets(config.max_stream_buffer_bytes, config.max_unsent_bytes)
        self.fronts = (NativeFront(self.engine, self.frame, budgets),
                       OipFront(self.engine, self.frame))
        self.health = health.aio.HealthServicer()
        self.tracing = tracing.setup(config)  # tracing: None (nothing at all) when off
        # The REST front: same engine and frame, on the gRPC server's loop (-1: off). The
        # page is off when a token is required, unless --ui says otherwise.
        locked = bool(config.auth_token or config.auth_tokens)
        ui = config.ui if config.ui is not None else not locked
        self.http = (HttpFront(self.engine, self.frame, self.tracing, ui,
                                config.max_concurrent_rpcs, budgets)
                     if config.http_port >= 0 else None)
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port = 0
        self._server: grpc.aio.Server | None = None
        self._poller: asyncio.Task[None] | None = None
        self._info_labels: dict[str, tuple[str, ...]] = {}
        self.stopped = asyncio.Event()

    def _on_load(self, model: str, version: int, result: str) -> None:
        self.metrics.model_loads.labels(model, result).inc()

    def _publish(self, loaded: list[LoadedModel]) -> None:
        for name in set(self._info_labels) - set(self.repo.models):  # no longer served
            self.metrics.model_info.remove(*self._info_labels.pop(name))
        for model in loaded:
            m = model.checkpoint.manifest
            old = self._info_labels.pop(model.name, None)
            if old is not None:
                self.metrics.model_info.remove(*old)
            labels = (model.name, str(model.version), model.checkpoint_id, str(m.dim),
                      str(m.vocab_size), str(m.max_seq_len), m.position, str(self.device))
            self.metrics.model_info.labels(*labels).set(1)
            self._info_labels[model.name] = labels

    async def _set_health(self, status: int) -> None:
        for name in ("", SERVICE_NAME, OIP_SERVICE_NAME):
            await self.health.set(name, status)

    async def refresh(self) -> None:
        """Rescan the repository, load what is new, and turn SERVING once a model is."""
        loaded = await asyncio.get_running_loop().run_in_executor(None, self.repo.refresh)
        self._publish(loaded)
        if self.engine.ready:
            await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        elif not self.engine.draining:  # every model's folder was removed
            await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.config.poll_seconds)
            try:
                await self.refresh()
            except Exception:  # a scan error must not stop future scans
                log.exception("repository scan failed")

    def _credentials(self) -> grpc.ServerCredentials | None:
        c = self.config
        if not c.tls_cert:
            return None
        ca = Path(c.tls_client_ca).read_bytes() if c.tls_client_ca else None
        return grpc.ssl_server_credentials(
            [(Path(c.tls_key).read_bytes(), Path(c.tls_cert).read_bytes())],
            root_certificates=ca, require_client_auth=ca is not None)

    async def start(self) -> None:
        """Bind, load what the repository holds, and start serving."""
        c = self.config
        options = [("grpc.max_send_message_length", c.max_message_bytes),
                   ("grpc.max_receive_message_length", c.max_message_bytes),
                   ("grpc.so_reuseport", 1 if c.workers > 1 else 0)]
        # Past max_concurrent_rpcs gRPC core answers RESOURCE_EXHAUSTED itself: no Python.
        server = self._server = grpc.aio.server(
            options=options, interceptors=tracing.interceptors(self.tracing),  # tracing
            maximum_concurrent_rpcs=c.max_concurrent_rpcs or None)
        server.add_generic_rpc_handlers(tuple(front.handlers() for front in self.fronts))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, OIP_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME),
            server, pool=ReflectionPool())
        address = f"{c.host}:{c.grpc_port}"
        creds = self._credentials()
        try:
            self.grpc_port = (server.add_secure_port(address, creds) if creds
                              else server.add_insecure_port(address))
        except RuntimeError as e:  # "Failed to bind": python -m service checked just before
            raise StartupError(bind_refusal("--grpc-port", c.host, c.grpc_port, e)) from None
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self.batcher.start()
        await server.start()
        try:
            await self._listen()
        except StartupError:
            await server.stop(0)
            await self.batcher.close()
            self.metrics.close()
            raise
        await self.refresh()
        if c.poll_seconds > 0:
            self._poller = asyncio.get_running_loop().create_task(self._poll())
        models = ", ".join(f"{m.name}/{m.version} ({m.checkpoint_id[:12]})"
                           for m in self.repo.models.values()) or "none yet"
        http = f"http :{self.http_port}" if self.http is not None else "http off"
        metrics = f"metrics :{self.metrics_port}" if c.metrics_port >= 0 else "metrics off"
        log.info("serving %s on %s:%d (%s, %s, device %s, default model %r)", models, c.host,
                 self.grpc_port, http, metrics, self.device, self.repo.default_model)

    async def _listen(self) -> None:
        """Bind the HTTP and metrics ports; StartupError naming the flag when one is taken."""
        c = self.config
        if self.http is not None:
            context = (server_ssl_context(c.tls_cert, c.tls_key, c.tls_client_ca)
                       if c.tls_cert else None)
            try:
                self.http_port = await self.http.start(c.host, c.http_port, context,
                                                       reuse_port=c.workers > 1)
            except OSError as e:
                raise StartupError(bind_refusal("--http-port", c.host, c.http_port, e)) from None
        if c.metrics_port >= 0:
            try:
                self.metrics_port = self.metrics.serve(c.host, c.metrics_port)
            except OSError as e:
                raise StartupError(bind_refusal("--metrics-port", c.host, c.metrics_port, e)
                                   ) from None

    async def drain(self, grace: float | None = None) -> None:
        """NOT_SERVING, refuse new work, let in-flight RPCs finish, then stop."""
        if self._server is None or self.engine.draining:
            return
        self.engine.draining = True
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        grace = self.config.shutdown_grace_seconds if grace is None else grace
        log.info("draining: waiting up to %.1fs for in-flight requests", grace)
        if self._poller is not None:
            self._poller.cancel()
        # Both transports stop accepting at once and share the grace for in-flight work.
        stops = [self._server.stop(grace)]
        if self.http is not None:
            stops.append(self.http.stop(grace))
        await asyncio.gather(*stops)
        await self.batcher.close()
        self._pool.shutdown(wait=False)
        self.metrics.close()
        tracing.shutdown(self.tracing)  # tracing: flush the spans still queued
        log.info("stopped")
        self.stopped.set()


async def serve(config: ServerConfig) -> None:
    """Run until SIGTERM/SIGINT, then drain within the grace period."""
    server = EmbeddingServer(config)
    # Handlers first: a SIGTERM that lands while loading (or just after the "serving" line)
    # still drains, once start() is done, instead of killing the process.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    # What start-up built (modules, tables, the servers) lives as long as the process: out
    # of the cyclic collector's reach, each collection walks only what requests allocate,
    # not the hundreds of thousands of objects torch and grpc brought in, which every
    # collection of the oldest generation walked again (make profile: most of a small
    # request's server CPU outside the service's own code).
    gc.collect()
    gc.freeze()
    await stop.wait()
    await server.drain()
