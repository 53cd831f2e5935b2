"""The layout, read from the code's own imports (``ast``; imports inside functions count,
those under ``if TYPE_CHECKING:`` do not, since they never run):

(a) no import cycles between modules, lazy imports included (a lazy import only hides one);
(b) layers never import upward: ``service.format`` nothing from engine, rpc or the top
    (server, ``__main__``, workers); ``service.engine`` nothing from rpc or the top;
(c) fronts are independent: no front in ``service/rpc/`` (native, oip, the ``http``
    package) imports another front; what they share there (frame, identity, oip_tensors)
    is not a front;
(d) ``client/`` never imports torch or service (it installs without them);
(e) ``service/rpc/`` reaches the engine through its package's public names only
    (``from service.engine import Engine, Request, ...``), never a module inside it: a
    request crosses into the engine by ``Engine.embed`` and comes back as its answer.

The checker runs on the repository and, so that it is known to catch what it claims, on
small synthetic trees with one seeded violation each.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP_DIRS = ("service", "client", "training", "bench", "examples", "scripts")
_SKIP_DIRS = {"__pycache__", "node_modules", "assets"}

# (b): importer prefix -> prefixes it must not import.
_TOP = ("service.server", "service.__main__", "service.workers")
LAYERS = {
    "service.format": ("service.engine", "service.rpc", *_TOP),
    "service.engine": ("service.rpc", *_TOP),
}
_FRONT_NAMES = ("native", "oip", "http")  # (c): a module, or a package of its own
_CLIENT_FORBIDDEN = ("torch", "service")  # (d)

Modules = dict[str, Path]
Graph = dict[str, set[str]]


def modules_under(root: Path, top_dirs: Iterable[str] = TOP_DIRS) -> Modules:
    """Dotted module name -> file, for every ``.py`` under ``top_dirs`` of ``root``."""
    found: Modules = {}
    for top in top_dirs:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            if _SKIP_DIRS.intersection(rel.parts):
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node``, at any depth, but not the body of an
    ``if TYPE_CHECKING:`` (its ``else`` runs, so it counts)."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
        return
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        children: Iterable[ast.AST] = node.orelse
    else:
        children = ast.iter_child_nodes(node)
    for child in children:
        yield from _import_nodes(child)


def imported_names(module: str, path: Path) -> set[str]:
    """Absolute dotted names this module imports: ``import a.b`` gives ``a.b``; ``from a
    import b`` gives ``a.b`` (a module or a name in ``a``: resolved later), relative
    imports made absolute."""
    names: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")[:len(package.split(".")) - (node.level - 1)]
            base = ".".join([*parts, base] if base else parts)
        names.update(f"{base}.{alias.name}" if alias.name != "*" else base
                     for alias in node.names)
    return names


def resolve(name: str, modules: Modules) -> str | None:
    """The module ``name`` refers to: the longest known module it starts with, if any."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def import_graph(modules: Modules) -> tuple[Graph, dict[str, set[str]]]:
    """Module -> the known modules it imports (self excluded), and module -> every name it
    imports (external ones too)."""
    graph: Graph = {}
    raw: dict[str, set[str]] = {}
    for module, path in modules.items():
        raw[module] = imported_names(module, path)
        graph[module] = {t for n in raw[module]
                         if (t := resolve(n, modules)) is not None and t != module}
    return graph, raw


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def upward_imports(graph: Graph) -> list[str]:
    """(b): ``importer -> imported`` for each import that reaches a layer above."""
    return sorted(f"{src} -> {dst}" for src, targets in graph.items() for dst in targets
                  for layer, above in LAYERS.items()
                  if _under(src, layer) and any(_under(dst, a) for a in above))


def front_of(module: str) -> str | None:
    """The front a module belongs to (``service.rpc.native``, ``service.rpc.http...``), or
    None for anything else, the shared wire helpers in service/rpc included."""
    parts = module.split(".")
    if len(parts) < 3 or parts[:2] != ["service", "rpc"]:
        return None
    name = parts[2]
    return name if name in _FRONT_NAMES else None


def cross_front_imports(graph: Graph) -> list[str]:
    """(c): ``front -> other front`` imports."""
    return sorted(f"{src} -> {dst}" for src, targets in graph.items() for dst in targets
                  if front_of(src) and front_of(dst) and front_of(src) != front_of(dst))


def engine_surface_imports(graph: Graph) -> list[str]:
    """(e): ``rpc module -> engine module`` for each import past the engine's package."""
    return sorted(f"{src} -> {dst}" for src, targets in graph.items() for dst in targets
                  if _under(src, "service.rpc") and _under(dst, "service.engine")
                  and dst != "service.engine")


def client_violations(raw: dict[str, set[str]]) -> list[str]:
    """(d): ``client module -> name`` for each import of torch or service in client/."""
    return sorted(f"{src} -> {name}" for src, names in raw.items() if _under(src, "client")
                  for name in names if any(_under(name, f) for f in _CLIENT_FORBIDDEN))


def check(root: Path, top_dirs: Iterable[str] = TOP_DIRS) -> dict[str, list[str]]:
    """Every violation under ``root``, by rule; all lists empty when the layout holds."""
    graph, raw = import_graph(modules_under(root, top_dirs))
    return {"cycles": [" <-> ".join(c) for c in cycles(graph)],
            "upward": upward_imports(graph), "fronts": cross_front_imports(graph),
            "surface": engine_surface_imports(graph), "client": client_violations(raw)}


# --- the repository -------------------------------------------------------------------

@pytest.fixture(scope="module")
def repo() -> dict[str, list[str]]:
    return check(ROOT)


def test_the_checker_sees_the_repository() -> None:
    graph, _ = import_graph(modules_under(ROOT))
    assert {"service.rpc.native", "service.engine.batcher", "client.codec",
            "training.train", "bench.harness.load"} <= set(graph)
    assert "service.format.tokenizer" in graph["training.train"]


@pytest.mark.parametrize("rule", ["cycles", "upward", "fronts", "surface", "client"])
def test_layout_rule_holds(repo: dict[str, list[str]], rule: str) -> None:
    assert repo[rule] == []


# --- the checker, on synthetic trees with seeded violations ----------------------------

def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


_CLEAN = {
    "service/__init__.py": "",
    "service/server.py": "from service.rpc import native\nfrom service.engine import batcher\n",
    "service/rpc/__init__.py": "",
    "service/rpc/native.py": ("from service.rpc.frame import Call\nfrom service import errors\n"
                              "from service.engine import Engine\n"),
    "service/rpc/oip.py": "from . import frame\n",
    "service/rpc/frame.py": "from service.format.checkpoint import read\n",
    "service/rpc/http/__init__.py": "from service.rpc.http.front import Front\n",
    "service/rpc/http/front.py": "from service.rpc import frame\n",
    "service/engine/__init__.py": "from service.engine.batcher import Batcher\n",
    "service/engine/batcher.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from service.rpc.native import Servicer\n"),
    "service/errors.py": "",
    "service/format/__init__.py": "",
    "service/format/checkpoint.py": "import json\n",
    "client/__init__.py": "",
    "client/codec.py": "import numpy\nfrom client import shm\n",
    "client/shm.py": "",
}


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    assert check(_tree(tmp_path, _CLEAN)) == {"cycles": [], "upward": [], "fronts": [],
                                              "surface": [], "client": []}


@pytest.mark.parametrize(("rule", "rel", "text", "expected"), [
    ("cycles", "service/errors.py", "def f():\n    from service.server import x\n",
     "service.errors <-> service.rpc.native <-> service.server"),
    ("cycles", "client/shm.py", "from .codec import decode\n", "client.codec <-> client.shm"),
    ("upward", "service/format/checkpoint.py", "from service.engine import batcher\n",
     "service.format.checkpoint -> service.engine.batcher"),
    ("upward", "service/engine/batcher.py", "def f():\n    import service.rpc.frame\n",
     "service.engine.batcher -> service.rpc.frame"),
    ("fronts", "service/rpc/oip.py", "from service.rpc.native import helper\n",
     "service.rpc.oip -> service.rpc.native"),
    ("fronts", "service/rpc/http/front.py", "from service.rpc import oip\n",
     "service.rpc.http.front -> service.rpc.oip"),
    ("surface", "service/rpc/http/front.py", "from service.engine.batcher import Batcher\n",
     "service.rpc.http.front -> service.engine.batcher"),
    ("client", "client/codec.py", "def f():\n    import torch\n", "client.codec -> torch"),
    ("client", "client/shm.py", "from service.dtypes import BY_WIRE\n",
     "client.shm -> service.dtypes.BY_WIRE"),
])
def test_the_checker_catches_a_seeded_violation(tmp_path: Path, rule: str, rel: str, text: str,
                                                expected: str) -> None:
    found = check(_tree(tmp_path, {**_CLEAN, rel: text}))
    assert found[rule] == [expected]
    assert all(v == [] for r, v in found.items() if r != rule)
