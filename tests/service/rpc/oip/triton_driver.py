"""Runs calls with the real ``tritonclient.grpc`` and prints their results as JSON.

A separate process on purpose: tritonclient registers Triton's ``inference.*`` protobuf
messages in the default descriptor pool, as does ``genproto.inference`` (the server's), and
one process cannot hold both. A real client lives in its own process anyway.

stdin: {"target": "host:port", "headers": {...}, "calls": [{"op": ..., ...}, ...]}; a call's
own "headers" are added to the common ones.
stdout: one JSON list, a result per call: {"ok": ...} or {"status": "INVALID_ARGUMENT",
"message": ...}. Tensors come back as {"datatype", "shape", "hex"} (raw little-endian).
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Any

import numpy as np
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException

_NUMPY = {"INT64": np.int64, "INT32": np.int32, "FP32": np.float32}  # input_ids as sent


def _tensor(array: np.ndarray) -> dict[str, Any]:
    return {"dtype": str(array.dtype), "shape": list(array.shape),
            "hex": np.ascontiguousarray(array).tobytes().hex()}


def _infer(client: tc.InferenceServerClient, call: dict[str, Any],
           headers: dict[str, str]) -> dict[str, Any]:
    if "ids" in call:
        wire = call.get("datatype", "INT64")
        data = np.array(call["ids"], dtype=_NUMPY[wire])
        inp = tc.InferInput("input_ids", list(data.shape), wire)
    else:
        data = np.array([t.encode("utf-8") if isinstance(t, str) else bytes.fromhex(t["hex"])
                         for t in call["texts"]], dtype=object)
        inp = tc.InferInput("text", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    outputs = [tc.InferRequestedOutput(name) for name in call.get("outputs", [])] or None
    shm = call.get("shm")
    if shm is not None:
        out = tc.InferRequestedOutput("embeddings")
        out.set_shared_memory(shm["region"], shm["byte_size"], shm.get("offset", 0))
        outputs = [out]
    result = client.infer(call.get("model", "tiny"), [inp], model_version=call.get("version", ""),
                          outputs=outputs, parameters=call.get("parameters"),
                          request_id=call.get("id", ""), headers=headers,
                          client_timeout=call.get("client_timeout"))
    response = result.get_response()
    got: dict[str, Any] = {"model_name": response.model_name,
                           "model_version": response.model_version, "id": response.id,
                           "parameters": {k: str(v).strip() for k, v in
                                          response.parameters.items()},
                           "outputs": {}}
    for output in response.outputs:
        if shm is None:
            got["outputs"][output.name] = _tensor(result.as_numpy(output.name))
        else:
            got["outputs"][output.name] = {"datatype": output.datatype,
                                           "shape": list(output.shape)}
    return got


def _together(client: tc.InferenceServerClient, call: dict[str, Any],
              headers: dict[str, str]) -> list[dict[str, Any]]:
    """Send every id list in ``call["ids"]`` at once (a thread each); one outcome each."""
    from concurrent.futures import ThreadPoolExecutor

    def one(ids: list[int]) -> dict[str, Any]:
        try:
            _infer(client, {"ids": [ids], "model": call.get("model", "tiny")}, headers)
        except InferenceServerException as e:
            return {"status": str(e.status()).removeprefix("StatusCode."),
                    "message": e.message()}
        return {"ok": True}

    with ThreadPoolExecutor(len(call["ids"])) as pool:
        return list(pool.map(one, call["ids"]))


def run(call: dict[str, Any], client: tc.InferenceServerClient,
        headers: dict[str, str]) -> Any:
    """One call's JSON-able result."""
    op = call["op"]
    if op == "infer":
        return _infer(client, call, headers)
    if op == "infer_together":  # several requests in flight at once (async_infer)
        return _together(client, call, headers)
    if op == "ready":
        return {"live": client.is_server_live(headers=headers),
                "ready": client.is_server_ready(headers=headers),
                "model_ready": client.is_model_ready(call["model"], headers=headers)}
    if op == "model_metadata":
        return client.get_model_metadata(call["model"], headers=headers, as_json=True)
    if op == "server_metadata":
        return client.get_server_metadata(headers=headers, as_json=True)
    if op == "index":
        return client.get_model_repository_index(headers=headers, as_json=True)
    if op == "shm_register":
        client.register_system_shared_memory(call["name"], call["key"], call["byte_size"],
                                             offset=call.get("offset", 0), headers=headers)
        return {}
    if op == "shm_status":
        return client.get_system_shared_memory_status(headers=headers, as_json=True)
    if op == "shm_unregister":
        client.unregister_system_shared_memory(call.get("name", ""), headers=headers)
        return {}
    if op == "cuda_register":  # the handle as hex: tritonclient takes it base64-encoded
        client.register_cuda_shared_memory(
            call["name"], base64.b64encode(bytes.fromhex(call["raw_handle"])),
            call.get("device_id", 0), call["byte_size"], headers=headers)
        return {}
    if op == "cuda_status":
        return client.get_cuda_shared_memory_status(call.get("name", ""), headers=headers,
                                                     as_json=True)
    if op == "cuda_unregister":
        client.unregister_cuda_shared_memory(call.get("name", ""), headers=headers)
        return {}
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    """Read the calls, run them in order, print the results."""
    spec = json.load(sys.stdin)
    headers = spec.get("headers") or {}
    client = tc.InferenceServerClient(spec["target"])
    results = []
    for call in spec["calls"]:
        try:
            results.append({"ok": run(call, client, {**headers, **call.get("headers", {})})})
        except InferenceServerException as e:
            results.append({"status": str(e.status()).removeprefix("StatusCode."),
                            "message": e.message()})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
