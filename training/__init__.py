"""Offline training job that produces embedding checkpoints."""
