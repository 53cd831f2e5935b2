"""What each ``/v2`` route of the REST front answers: health, metadata, the repository
index, infer and the page's tokenize helper. Each runs inside the frame (``front.py``
registers them), takes the request, its path parameters and the frame's ``Call``, and
returns the response to send; infer makes one engine call.
"""

from __future__ import annotations

import json
from importlib import metadata

from aiohttp import web

from service.engine import Engine, Request, RestHold, RestReply, RestSlots, Slot, StreamBudgets
from service.errors import EmbedError, InvalidArgument
from service.rpc.frame import Call
from service.rpc.http.facts import model_facts
from service.rpc.http.infer import EXTENSIONS, parse_infer
from service.rpc.http.send import BufferAnswer
from service.rpc.http.wire import HEADER_LENGTH, header_length, json_response, read_body
from service.rpc.oip_tensors import model_metadata, model_version

__all__ = ["SLOT", "Endpoints"]

SLOT = web.RequestKey("slot", Slot)  # the request's in-flight slot, for infer's budget wait


class Endpoints:
    """The bodies of the ``/v2`` routes, on the engine every front holds."""

    def __init__(self, engine: Engine, slots: RestSlots, budgets: StreamBudgets,
                 max_body: int) -> None:
        self.engine = engine
        self.slots = slots  # the REST in-flight cap; infer's answer waits for room in it
        self.budgets = budgets  # the unsent-answer budget the gRPC streams share too
        self.max_body = max_body

    # -- health and metadata --------------------------------------------------------------

    async def server_live(self, request: web.BaseRequest, params: dict[str, str],
                          call: Call) -> web.StreamResponse:
        """200 while the process answers (the frame answers 503 while draining)."""
        return json_response({"live": True})

    async def server_ready(self, request: web.BaseRequest, params: dict[str, str],
                           call: Call) -> web.StreamResponse:
        """200 when a model is loaded; 400 (the protocol's "4xx is false") before."""
        ready = self.engine.ready
        return json_response({"ready": ready}, 200 if ready else 400)

    async def model_ready(self, request: web.BaseRequest, params: dict[str, str],
                          call: Call) -> web.StreamResponse:
        """200 when the model (and version) is loaded, else 400."""
        try:
            self.engine.model(params["model"], model_version(params.get("version", "")))
        except EmbedError:
            return json_response({"name": params["model"], "ready": False}, 400)
        return json_response({"name": params["model"], "ready": True})

    async def server_metadata(self, request: web.BaseRequest, params: dict[str, str],
                              call: Call) -> web.StreamResponse:
        """Name, version and the protocol extensions served over HTTP."""
        try:
            version = metadata.version("embedding-service")
        except metadata.PackageNotFoundError:
            version = "0"
        return json_response({"name": "embedding-service", "version": version,
                      "extensions": EXTENSIONS})

    async def model_metadata(self, request: web.BaseRequest, params: dict[str, str],
                             call: Call) -> web.StreamResponse:
        """The model's tensors, as the gRPC form's ModelMetadata states them."""
        model = self.engine.model(params["model"], model_version(params.get("version", "")))
        return json_response(model_metadata(model))

    async def repository_index(self, request: web.BaseRequest, params: dict[str, str],
                               call: Call) -> web.StreamResponse:
        """Every version on disk (Triton's repository extension): READY, UNAVAILABLE or
        AVAILABLE; ``{"ready": true}`` in the body lists the served ones only."""
        body = await read_body(request, self.max_body, call.deadline)
        only_ready = False
        if body.strip():
            try:
                only_ready = json.loads(body).get("ready", False) is True
            except (ValueError, AttributeError, RecursionError):
                raise InvalidArgument("repository index body must be a JSON object") from None
        rows = [{"name": n, "version": str(v), "state": s, "reason": r}
                for n, v, s, r in self.engine.repo.index() if not only_ready or s == "READY"]
        return json_response(rows)

    # -- inference ------------------------------------------------------------------------

    async def infer(self, request: web.BaseRequest, params: dict[str, str],
                    call: Call) -> web.StreamResponse:
        """Token ids or text in, [B, T, C] input embeddings out (binary or JSON)."""
        body = await read_body(request, self.max_body, call.deadline)
        infer = parse_infer(body, header_length(request), params["model"],
                            model_version(params.get("version", "")))
        # The answer's bytes are held once it is admitted, before its output is allocated,
        # at their upper bound (past --max-unsent-bytes: a second's wait without the slot,
        # then 429); settled to the answer's own length once it is built, and given back
        # once sent.
        hold = RestHold(self.slots, request[SLOT])
        try:
            answer = await self.engine.embed(Request(
                infer.options, infer.inputs, RestReply(infer.request_id, infer.outputs),
                call.start_ns, call.deadline, infer.request_id, call, hold))
        except BaseException:
            hold.give_back()
            raise
        hold.settle(len(answer.body))
        headers = (None if answer.header_length is None
                   else {HEADER_LENGTH: str(answer.header_length)})
        return BufferAnswer(answer.body, answer.content_type, headers, hold.held, self.budgets)

    async def tokenize(self, request: web.BaseRequest, params: dict[str, str],
                       call: Call) -> web.StreamResponse:
        """The page's helper: an infer request's sequences as admission reads them (ids
        after truncation, each token's text, each row's untrained flag) and the model's
        widths and rules (``facts.model_facts``); no lookup."""
        body = await read_body(request, self.max_body, call.deadline)
        infer = parse_infer(body, header_length(request), params["model"],
                            model_version(params.get("version", "")))
        admitted = await self.engine.read(infer.options, infer.inputs)
        model = admitted.model
        sequences = []
        for seq in admitted.sequences:
            ids = seq.ids.tolist()
            try:
                tokens: list[str] | None = [t.decode("utf-8", "replace")
                                            for t in model.tokenizer.token_bytes(ids)]
            except EmbedError:  # a model served without a tokenizer
                tokens = None
            untrained = (model.untrained.numpy()[seq.ids].tolist()
                         if model.untrained is not None else None)
            sequences.append({"ids": ids, "tokens": tokens, "untrained": untrained,
                              "start_position": seq.start_position,
                              "truncated_tokens": seq.truncated_tokens})
        return json_response({"model_name": model.name, "model_version": str(model.version),
                              **model_facts(model), "sequences": sequences})
