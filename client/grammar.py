"""What a user may type, the same in every tool: token-id lists, enum spellings, option values.

embedctl, this Python client, the Node.js client (``client/node/grammar.js``) and the page
(``service/rpc/http/page/page.js``) accept exactly the same input and refuse everything else
before a request is sent, naming the bad item. ``tests/vectors/client_inputs.json`` is the
one table of valid and invalid cases that every tool's tests read.

Token-id list (text): integers separated by commas, e.g. ``1,2,3``. Spaces, tabs and line
breaks around an item are ignored (``1, 2, 3``); anything else is an error: an empty item
(``1,,2``, ``1,2,``), an item that is not a decimal integer (``1 2``, ``1.5``, ``0x10``,
``[1``), an item beyond ±(2**53 - 1). Ranges against the vocabulary are the server's check.

Target (where a tool connects): ``host:port`` with a port in 1..65535, ``[IPv6]:port``,
``dns:///host:port``, or ``unix:PATH``. A URL (``http://host:port``), a missing port or
port 0 is refused: each is a grpc target that fails only when the connection is tried.

Enum spellings (case as written, no folding): each value has its short name (embedctl's),
its Open Inference Protocol name and its .proto enum name, e.g. ``token``, ``token_only``,
``COMPOSE_TOKEN_ONLY``.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Mapping
from typing import Any

from client.rules import Rule
from genproto.embedding.v1 import embedding_pb2 as pb

__all__ = [
    "IDS_FORM",
    "MAX_ID",
    "SPELLINGS",
    "TARGET",
    "TARGET_FORM",
    "UINT32_MAX",
    "check_bool",
    "check_int",
    "check_option_names",
    "check_str",
    "enum_value",
    "is_target",
    "parse_ids",
    "split_target",
    "token_id",
]

IDS_FORM = "give integers separated by commas, e.g. 1,2,3"
MAX_ID = 2**53 - 1  # the largest integer a JavaScript number (the Node client, the page) holds
UINT32_MAX = 2**32 - 1
_ITEM = re.compile(r"-?[0-9]+")
TARGET_FORM = "host:port (port 1..65535), [IPv6]:port, dns:///host:port or unix:PATH"
_HOST_PORT = re.compile(r"(?:dns:(?:///)?)?(?:\[([0-9A-Fa-f:.]+(?:%[A-Za-z0-9._-]+)?)\]"
                        r"|([A-Za-z0-9._-]+)):([0-9]{1,5})")
_UNIX = re.compile(r"unix:[^\s]+")
_BLANK = " \t\r\n"

# field -> .proto enum name -> its spellings, short name first. One table: every tool
# accepts these and nothing else (the vectors file holds a copy the tests compare with).
SPELLINGS: dict[str, dict[str, tuple[str, ...]]] = {
    "compose": {
        "COMPOSE_TOKEN_PLUS_POSITION": ("token+position", "token_plus_position"),
        "COMPOSE_TOKEN_ONLY": ("token", "token_only"),
        "COMPOSE_POSITION_ONLY": ("position", "position_only"),
    },
    "dtype": {
        "DTYPE_FLOAT32": ("float32", "FP32"),
        "DTYPE_FLOAT16": ("float16", "FP16"),
        "DTYPE_BFLOAT16": ("bfloat16", "BF16"),
    },
    "truncate": {
        "TRUNCATE_NONE": ("none",),
        "TRUNCATE_RIGHT": ("right",),
        "TRUNCATE_LEFT": ("left",),
    },
}
_ENUMS = {"compose": pb.Compose, "dtype": pb.DType, "truncate": pb.Truncate}
# spelling -> .proto enum name, per field, in the order the error message lists them.
_LOOKUP: dict[str, dict[str, str]] = {
    field: {s: name for name, short in table.items() for s in (*short, name)}
    for field, table in SPELLINGS.items()}


def parse_ids(text: str) -> list[int]:
    """A token-id list typed as text (``"1,2,3"``) -> [1, 2, 3]; ValueError naming the item."""
    if not text.strip(_BLANK):
        raise ValueError(f"no token ids: {IDS_FORM}")
    ids = []
    for n, raw in enumerate(text.split(","), start=1):
        item = raw.strip(_BLANK)
        if not item:
            raise ValueError(f"item {n} of the token ids is empty: {IDS_FORM}")
        if _ITEM.fullmatch(item) is None:
            raise ValueError(f"item {n} of the token ids, '{item}', is not an integer: "
                             f"{IDS_FORM}")
        value = int(item)
        if abs(value) > MAX_ID:
            raise ValueError(f"item {n} of the token ids, '{item}', is beyond ±{MAX_ID}")
        ids.append(value)
    return ids


def split_target(target: str) -> tuple[str, int] | None:
    """``host:port``, ``[v6]:port`` or ``dns:///host:port`` -> (host, port); None for
    anything else (``unix:PATH`` included)."""
    match = _HOST_PORT.fullmatch(target)
    if match is None or not 1 <= int(match.group(3)) <= 65535:
        return None
    return match.group(1) or match.group(2), int(match.group(3))


def is_target(target: str) -> bool:
    """Whether ``target`` is one of TARGET_FORM's forms."""
    return split_target(target) is not None or _UNIX.fullmatch(target) is not None


# The command-line rule (client/flags.py) of every --target option.
TARGET = Rule(TARGET_FORM, test=is_target)


def check_int(name: str, value: Any, low: int, high: int) -> int:
    """``value`` as an int in [low, high] (numpy ints too, never bool); else ValueError."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or not low <= number <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return number


def token_id(index: int, value: Any) -> int:
    """One element of an id sequence: an integer within ±MAX_ID; else ValueError naming it."""
    return check_int(f"ids[{index}]", value, -MAX_ID, MAX_ID)


def enum_value(field: str, value: str | int) -> Any:
    """A compose/dtype/truncate spelling (or the .proto enum's number) -> the enum's number.

    Numbers pass through for callers holding pb enum values; the server checks their range.
    Any: the pb stubs type each enum field as its own int subclass.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    name = _LOOKUP[field].get(value) if isinstance(value, str) else None
    if name is None:
        # Quoted as the Node client and the page show it (JSON for non-strings).
        shown = f"'{value}'" if isinstance(value, str) else json.dumps(value, default=repr)
        raise ValueError(f"{field} {shown}: expected one of {', '.join(_LOOKUP[field])}")
    return _ENUMS[field].Value(name)


def check_str(name: str, value: Any) -> str:
    """``value`` if it is a str; else ValueError naming the option."""
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool; else ValueError naming the option."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def check_option_names(options: Mapping[str, Any], known: frozenset[str]) -> None:
    """TypeError naming the first unknown option and the known ones (``**options`` would
    otherwise drop a misspelt name silently)."""
    for key in options:
        if key not in known:
            raise TypeError(f"unknown option '{key}'; known options: {', '.join(sorted(known))}")
