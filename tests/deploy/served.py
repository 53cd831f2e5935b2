"""What a deployed server answers over gRPC, as the image check, the Kubernetes scenario and
the pods' probes ask it: whether its health says SERVING, and the OIP ModelInfer of IDS."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from genproto.inference.v2 import grpc_service_pb2 as oip
from genproto.inference.v2 import grpc_service_pb2_grpc as oip_grpc

__all__ = ["IDS", "model_infer", "serving"]

IDS = [31373, 995, 11, 50256, 0, 1000, 50000]


def serving(target: str, service: str = "", timeout: float = 2.0) -> bool:
    """Whether gRPC health says ``service`` is SERVING at ``target`` (False: any other
    status, or no answer within ``timeout``)."""
    try:
        with grpc.insecure_channel(target) as ch:
            status = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout).status
    except grpc.RpcError:
        return False
    return bool(status == health_pb2.HealthCheckResponse.SERVING)


def model_infer(target: str, model: str) -> oip.ModelInferResponse:
    """OIP ModelInfer of IDS (INT64 [1, T]) from ``model`` at ``target``."""
    tensor = oip.ModelInferRequest.InferInputTensor
    request = oip.ModelInferRequest(model_name=model, inputs=[tensor(
        name="input_ids", datatype="INT64", shape=[1, len(IDS)],
        contents=oip.InferTensorContents(int64_contents=IDS))])
    with grpc.insecure_channel(target) as ch:
        return oip_grpc.GRPCInferenceServiceStub(ch).ModelInfer(request, timeout=30)
