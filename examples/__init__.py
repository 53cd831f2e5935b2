"""Runnable examples: this service's embeddings fed to HF GPT-2, vLLM and a downstream service.

Each is a script (``python examples/<name>.py --help``) that runs offline with small models
it builds itself; tests/examples/ runs each against a real server. See docs/interop.md.
command.py is no example: it holds what their command lines share.
"""
