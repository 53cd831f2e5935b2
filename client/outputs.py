"""Where an Embed's rows go, on the client side: into the response, a host shared-memory
region (client.shm) or a CUDA region (client.cuda_shm); the request's ``output`` and the
answer's decoding for each."""

from __future__ import annotations

import dataclasses

from client.codec import Embedding, decode_embedding
from client.cuda_shm import CudaEmbedding, CudaSharedMemoryRegion, rows_from_cuda_region
from client.shm import SharedMemoryRegion, rows_from_region
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = ["decoded", "placed"]


def placed(request: pb.EmbedRequest, shm: SharedMemoryRegion | None, offset: int,
           cuda: CudaSharedMemoryRegion | None, cuda_offset: int) -> pb.EmbedRequest:
    """``request`` with its ``output`` naming the region the rows go to, if any."""
    if shm is not None and cuda is not None:
        raise ValueError("give shm or cuda_region, not both: the rows go to one region")
    if shm is not None:
        request.output.CopyFrom(pb.SharedMemoryOutput(region=shm.name, offset=offset))
    if cuda is not None:
        request.output.CopyFrom(pb.SharedMemoryOutput(region=cuda.name, offset=cuda_offset,
                                                      cuda=True))
    return request


def decoded(resp: pb.EmbedResponse, shm: SharedMemoryRegion | None, raw_bfloat16: bool,
            cuda: CudaSharedMemoryRegion | None = None) -> Embedding | CudaEmbedding:
    """The answer, with its rows read where ``placed`` put them (a view, never a copy)."""
    if cuda is not None:
        return rows_from_cuda_region(cuda, resp)
    if shm is None:
        return decode_embedding(resp, raw_bfloat16)
    rows = rows_from_region(shm, resp.embeddings, resp.output, raw_bfloat16)
    return dataclasses.replace(decode_embedding(_without_rows(resp), raw_bfloat16), array=rows)


def _without_rows(resp: pb.EmbedResponse) -> pb.EmbedResponse:
    # decode_embedding checks data against shape; an shm response has shape and no data.
    empty = pb.EmbedResponse()
    empty.CopyFrom(resp)
    empty.embeddings.shape[:] = [0, 0]
    return empty
