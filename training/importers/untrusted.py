"""A model directory is data: nothing in it is imported or run, whatever anyone answers.

Hugging Face directories may ship Python files (``configuration_*.py``, ``modeling_*.py``,
``tokenization_*.py``) and name them in their JSON (``auto_map``); transformers would
import them on request, and asks on standard input when not told. Here:

- ``refuse_custom_code`` reads the JSON files the importers and transformers' loaders
  read (``CHECKED_FILES``) as data and refuses, in one line naming the file and the key,
  a directory that names code of its own: an ``auto_map`` or ``custom_pipelines`` at any
  depth, an ``architectures`` entry or a ``tokenizer_class`` that is not one of
  transformers' own classes. It runs before any transformers call on the directory.
- ``guarded`` wraps every transformers call: offline (``HF_HUB_OFFLINE``), standard input
  replaced by an empty stream, transformers' loader of dynamic modules replaced by a
  refusal, its log and warnings kept off the terminal. Every call also passes
  ``SAFE_KWARGS`` (``local_files_only=True``, ``trust_remote_code=False``).
- A library's exception reaches a message only through ``source.reason``: its first line,
  without any sentence advising to weaken a safety setting.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from training.importers.source import ImporterError, read_json_object

__all__ = ["CHECKED_FILES", "IMPORT_EXTRA", "SAFE_KWARGS", "guarded", "load_transformers",
           "refuse_custom_code", "transformers_or_none"]

IMPORT_EXTRA = "pip install -e '.[import]'"  # transformers + sentencepiece, as requirements-dev.txt
# Every transformers entry point is called with these: local files only, no remote code.
SAFE_KWARGS: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
# The JSON files the importers read, and those AutoConfig / AutoTokenizer read beside them.
CHECKED_FILES = ("config.json", "tokenizer_config.json", "special_tokens_map.json",
                 "added_tokens.json")
_CODE_KEYS = ("auto_map", "custom_pipelines")  # values that name Python files to import
def _offline() -> None:
    """Tell huggingface_hub and transformers never to reach the network (before import)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:  # imported before us (a test, a notebook): its flag is read at import
        setattr(hub, "HF_HUB_OFFLINE", True)  # noqa: B010 (not in its stubs)


def transformers_or_none() -> Any:
    """The transformers module (offline), or None where it is not installed."""
    _offline()
    try:
        import transformers
    except ImportError:
        return None
    return transformers


def load_transformers() -> Any:
    """The transformers module (offline), or an ImporterError naming the extra."""
    tf = transformers_or_none()
    if tf is None:
        raise ImporterError(f"discovering a family's embedding rules needs transformers, "
                            f"which is not installed: {IMPORT_EXTRA} (the 'import' extra); "
                            f"hand-written families import without it")
    return tf


def _refuse_dynamic_module(*args: Any, **kwargs: Any) -> Any:
    raise ImporterError("a model directory asked to run its own code: refused (files in a "
                        "model directory are data and are never run)")


@contextmanager
def guarded() -> Iterator[Any]:
    """Around every transformers call: offline, no standard input, no dynamic modules,
    transformers' own log and warnings kept quiet. Yields the transformers module."""
    tf = load_transformers()
    from transformers import dynamic_module_utils as dynamic
    from transformers.utils import logging as tf_logging

    stdin, verbosity = sys.stdin, tf_logging.get_verbosity()
    loader = getattr(dynamic, "get_class_in_module", None)
    sys.stdin = io.StringIO()  # empty: input() raises EOFError, no answer is ever read
    dynamic.get_class_in_module = _refuse_dynamic_module  # the one place modules are run
    tf_logging.set_verbosity(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield tf
    finally:
        sys.stdin = stdin
        if loader is not None:
            dynamic.get_class_in_module = loader
        tf_logging.set_verbosity(verbosity)


def _transformers_class(tf: Any, name: str) -> bool:
    """True when ``name`` is one of transformers' own classes (never a directory's)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return False
    try:
        cls = getattr(tf, name, None)
    except Exception:  # transformers' lazy module raises its own errors for missing names
        return False
    return isinstance(cls, type) and cls.__module__.startswith("transformers.")


def _tokenizer_class(tf: Any, name: str) -> bool:
    """A tokenizer_class transformers resolves to one of its own (with or without Fast)."""
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    for candidate in (name, name.removesuffix("Fast"), name + "Fast"):
        try:
            cls = tokenizer_class_from_name(candidate)
        except Exception:  # an odd name: not one of transformers' own
            cls = None
        if isinstance(cls, type) and cls.__module__.startswith("transformers."):
            return True
    return _transformers_class(tf, name)


def _code_key(value: Any, path: str = "") -> tuple[str, Any] | None:
    """(dotted key, value) of the first ``auto_map`` / ``custom_pipelines`` at any depth."""
    items = (value.items() if isinstance(value, dict)
             else enumerate(value) if isinstance(value, list) else ())
    for key, item in items:
        where = (f"{path}[{key}]" if isinstance(value, list)
                 else f"{path}.{key}" if path else str(key))
        if isinstance(value, dict) and key in _CODE_KEYS:
            return where, item
        found = _code_key(item, where)
        if found:
            return found
    return None


def _class_names(value: Any, path: str = "") -> Iterator[tuple[str, str, Any]]:
    """(dotted key, key, value) of every ``architectures`` / ``tokenizer_class``."""
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key in ("architectures", "tokenizer_class"):
                yield where, key, item
            else:
                yield from _class_names(item, where)


def refuse_custom_code(model_dir: Path) -> None:
    """ImporterError (one line: file, key, what it names) when any file of CHECKED_FILES
    names code of the directory's own; nothing in the directory is run either way."""
    tf = None
    for name in CHECKED_FILES:
        path = Path(model_dir) / name
        if not path.is_file():
            continue
        data = read_json_object(path)
        found = _code_key(data)
        if found is not None:
            key, value = found
            raise ImporterError(f"{path}: {key} names Python code to import "
                                f"({_short(json.dumps(value))}): refused; files in a model "
                                f"directory are data and are never run")
        for where, kind, value in _class_names(data):
            names = value if isinstance(value, list) else [value]
            tf = tf or transformers_or_none()
            for cls in names:
                if value is None or cls is None:
                    continue
                if not isinstance(cls, str):
                    raise ImporterError(f"{path}: {where} must name a class, not "
                                        f"{_short(json.dumps(cls))}")
                if tf is None:
                    continue  # without transformers no class of any name is ever loaded
                known = (_tokenizer_class(tf, cls) if kind == "tokenizer_class"
                         else _transformers_class(tf, cls))
                if not known:
                    raise ImporterError(
                        f"{path}: {where} names {cls!r}, which is not a class of transformers "
                        f"{tf.__version__}: refused; files in a model directory are data and "
                        f"are never run")


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
