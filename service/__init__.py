"""Input-embedding server: checkpoint in, gRPC out."""
