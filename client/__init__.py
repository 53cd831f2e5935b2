"""Light client for the embedding service (grpcio + numpy, no torch)."""
