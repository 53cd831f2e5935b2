"""The engine: admission, batching and the table lookup, shared by every front."""
