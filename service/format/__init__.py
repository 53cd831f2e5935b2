"""The on-disk contract shared with training: checkpoints and tokenizers."""
