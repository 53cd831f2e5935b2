"""The model repository: which versions are loaded, and hot reload.

``models/<model>/<version>/``: each model serves its newest valid version (or a pinned
one). A version that fails verification is refused with one clear log line, remembered
(by path and the change time of its files) so it is not retried every poll until it
changes, and the version already loaded keeps serving. A new version that fails while it
may still be being copied in is "not ready yet" instead (``pending_versions.py``: one
INFO line, not counted as a failure) until it stays unchanged for the grace time. Loading
one version is ``loading.py``.

The disk is what is served: when the served version's folder is removed, the next scan
rolls back to the newest valid version left (a WARNING line says so); when no valid
version is left, or the model's folder is removed, the model is no longer served. Swaps
are a single dict assignment, so a request sees either the old or the new version, never
half of each.

One bad entry never stops a scan: whatever a version holds (any exception while loading
it), it is refused and skipped; a folder that is not a version (``²``, ``01``, ``abc``) is
ignored with one log line; a model folder that cannot be listed is skipped. The server
starts with the valid versions, and hot reload keeps working for every other model.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import torch

from service.config import parse_pins
from service.engine.loading import LoadedModel, load_model
from service.engine.pending_versions import PendingVersions, tree_signature
from service.engine.permissions import permission_error, unlistable_message, unreadable_message
from service.errors import NotFound, Unavailable, quote
from service.format.checkpoint import is_version_name, list_versions
from service.format.tensorfile import CheckpointError

__all__ = ["Repository", "parse_pins", "public_reason"]

log = logging.getLogger("service.engine.repository")


_ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])/[^\s'\",:;()\[\]]+")


def public_reason(reason: str, root: Path) -> str:
    """A refusal reason fit for clients (``RepositoryIndex``): paths inside the repository
    become relative (``tiny/3/manifest.json: ...``) and any other absolute path becomes
    ``<path>``; the server's own log keeps the full text."""
    for prefix in {str(root.resolve()), str(root.absolute()), str(root)}:
        if prefix not in (".", ""):
            reason = reason.replace(prefix.rstrip("/") + "/", "")
    return _ABSOLUTE_PATH.sub("<path>", reason)


class Repository:
    """Loaded models by name; ``refresh`` (re)scans the directory."""

    def __init__(self, root: Path, device: torch.device, table_dtype: torch.dtype | None,
                 default_model: str = "", pins: dict[str, int] | None = None,
                 on_load: Callable[[str, int, str], None] | None = None,
                 grace_seconds: float = 0.0) -> None:
        self.root = Path(root)
        self.device = device
        self.table_dtype = table_dtype
        self._default = default_model
        self._pins = dict(pins or {})
        self._on_load = on_load  # (model, version, "ok"|"error") for metrics
        self._models: dict[str, LoadedModel] = {}
        self._refused: dict[Path, float] = {}  # version dir -> tree_signature when refused
        self._pending = PendingVersions(grace_seconds)  # failed, but maybe still being copied in
        self._default_missing = False  # the default model is not among the loaded ones
        self._reasons: dict[Path, str] = {}  # version dir -> why it was refused
        self._ignored: set[Path] = set()  # entries logged once as not a version / unreadable

    @property
    def models(self) -> dict[str, LoadedModel]:
        """Snapshot of the loaded models (one per name)."""
        return self._models

    @property
    def default_model(self) -> str:
        """The configured default, else the first loaded name in sorted order."""
        if self._default:
            return self._default
        return min(self._models) if self._models else ""

    def get(self, model: str, version: int) -> LoadedModel:
        """The loaded version asked for; "" and 0 mean default model and newest version."""
        models = self._models
        if not models:
            raise Unavailable("no model is loaded yet; retry shortly")
        name = model or self.default_model
        loaded = models.get(name)
        if loaded is None:
            which = (f"model {quote(name)}" if model else
                     f"the default model {quote(name)} (the server's --default-model; the "
                     f"request named no model)")
            raise NotFound(f"{which} is not loaded (loaded: {', '.join(sorted(models))})")
        if version not in (0, loaded.version):
            raise NotFound(f"version {version} of model {name!r} is not loaded "
                           f"(serving version {loaded.version})")
        return loaded

    def index(self) -> list[tuple[str, int, str, str]]:
        """Every version directory on disk: (model, version, state, reason), where state is
        READY (served), UNAVAILABLE (refused, or not ready yet: the reason says why) or
        AVAILABLE (valid as far as we know, but not the version served: older, or not the
        pinned one)."""
        if not self.root.is_dir():
            return []
        models = self._models
        rows = []
        for model_dir in self._model_dirs() or []:
            loaded = models.get(model_dir.name)
            try:
                versions = list_versions(model_dir)
            except OSError:
                continue
            for version in versions:
                reason = self._reasons.get(model_dir / str(version))
                if loaded is not None and loaded.version == version:
                    rows.append((model_dir.name, version, "READY", ""))
                elif reason is not None:
                    public = public_reason(reason, self.root)
                    where = f"{model_dir.name}/{version}/"
                    head = public.split(":", 1)[0]
                    if " " not in head and "/" not in head:  # "embeddings.safetensors: ..."
                        public = where + public  # the file, named inside the repository
                    rows.append((model_dir.name, version, "UNAVAILABLE", public))
                else:
                    rows.append((model_dir.name, version, "AVAILABLE", "not the served version"))
        return rows

    def refresh(self) -> list[LoadedModel]:
        """Load any newer valid version of each model, roll back a model whose served
        version's directory was removed, drop a model whose folder was removed; returns
        what was newly loaded."""
        if not self.root.is_dir():
            return []  # not mounted (yet): keep serving what is loaded
        model_dirs = self._model_dirs()
        if model_dirs is None:
            return []
        loaded: list[LoadedModel] = []
        for model_dir in model_dirs:
            try:
                candidate, removed = self._load_newest(model_dir)
            except OSError as e:  # the model folder itself cannot be listed
                self._unlistable(model_dir, e)
                continue
            if candidate is not None:
                self._models = {**self._models, candidate.name: candidate}
                loaded.append(candidate)
            elif removed is not None:
                self._unload(model_dir.name, f"its version {removed} was removed and no "
                                             f"valid version is left to roll back to")
        for name in sorted(set(self._models) - {d.name for d in model_dirs}):
            self._unload(name, "its folder was removed from the repository")
        self._forget_removed()
        self._check_default()
        return loaded

    def _unload(self, name: str, why: str) -> None:
        models = dict(self._models)
        gone = models.pop(name)
        self._models = models  # one assignment: a request sees the model or NOT_FOUND
        log.warning("model=%s version=%d is no longer served: %s", name, gone.version, why)

    def _forget_removed(self) -> None:
        """Drop what is remembered about version folders that are gone."""
        for path in [p for p in self._reasons if not p.is_dir()]:
            self._refused.pop(path, None)
            self._reasons.pop(path, None)
            self._pending.forget(path)

    def _check_default(self) -> None:
        """One warning when models are loaded but the configured default is not one of
        them (requests that name no model then get NOT_FOUND saying so)."""
        missing = bool(self._default and self._models and self._default not in self._models)
        if missing and not self._default_missing:
            log.warning("the default model %r (--default-model) is not loaded; loaded: %s. "
                        "Requests that name no model get NOT_FOUND until it is", self._default,
                        ", ".join(sorted(self._models)))
        self._default_missing = missing

    def _model_dirs(self) -> list[Path] | None:
        try:
            return sorted(p for p in self.root.iterdir() if p.is_dir())
        except OSError as e:
            self._unlistable(self.root, e)
            return None

    def _ignore(self, path: Path, why: str) -> None:
        """One log line per path for an entry the scan skips (not a refused version)."""
        if path not in self._ignored:
            self._ignored.add(path)
            log.warning("ignored %s: %s", ascii(str(path)), why)

    def _unlistable(self, path: Path, e: OSError) -> None:
        """One error line per directory the scan cannot list: plainly why, and the fix."""
        if path not in self._ignored:
            self._ignored.add(path)
            log.error("cannot scan %s: %s", ascii(str(path)), unlistable_message(e, path))

    def _load_newest(self, model_dir: Path) -> tuple[LoadedModel | None, int | None]:
        """The version to swap in (or None), and the served version if its directory was
        removed (then the newest valid one left is loaded: a rollback)."""
        name = model_dir.name
        current = self._models.get(name)
        for entry in model_dir.iterdir():
            if not entry.name.startswith(".") and not is_version_name(entry.name):
                self._ignore(entry, "not a version folder (a positive integer in ASCII "
                                    "digits, no leading zero)")
        on_disk = list_versions(model_dir)
        versions = on_disk
        if name in self._pins:
            pin = self._pins[name]
            versions = [v for v in on_disk if v == pin]
            if not versions:
                self._ignore(model_dir / str(pin), f"model {name!r} is pinned to version "
                             f"{pin} (--pin-versions), which is not in the repository "
                             f"(versions: {', '.join(map(str, on_disk)) or 'none'}); "
                             f"not serving it")
        removed = None
        if current is not None and current.version not in on_disk:
            removed = current.version
            log.warning("model=%s version=%d: its folder was removed; rolling back to the "
                        "newest valid version left", name, removed)
            current = None
        for version in reversed(versions):
            if current is not None and version <= current.version:
                return None, None  # what we serve is already the newest valid one
            version_dir = model_dir / str(version)
            signature = tree_signature(version_dir)
            if self._refused.get(version_dir) == signature:
                continue
            try:
                model = load_model(name, version_dir, self.device, self.table_dtype)
            except Exception as e:  # whatever is on disk: refuse it, keep scanning
                denied = permission_error(e)
                reason = (unreadable_message(denied, version_dir) if denied
                          else str(e) if isinstance(e, CheckpointError | ValueError | OSError)
                          else f"{type(e).__name__}: {e}")
                if not self._pending.settled(version_dir, signature):
                    self._not_ready(name, version, version_dir, reason)
                    continue
                self._refused[version_dir] = signature
                self._reasons[version_dir] = reason
                log.error("refused model=%s version=%d: %s", name, version,
                          reason.replace("\n", " "))
                if self._on_load:
                    self._on_load(name, version, "error")
                continue
            self._refused.pop(version_dir, None)
            self._reasons.pop(version_dir, None)
            self._pending.forget(version_dir)
            if removed is not None:
                log.warning("rolled back model=%s from version %d (removed) to version %d",
                            name, removed, version)
            log.info("loaded model=%s version=%d checkpoint_id=%s dim=%d vocab_size=%d "
                     "max_seq_len=%d position=%s family=%s rules=%s device=%s", name, version,
                     model.checkpoint_id[:16], model.tables.dim,
                     model.checkpoint.manifest.vocab_size, model.checkpoint.manifest.max_seq_len,
                     model.checkpoint.manifest.position,
                     model.checkpoint.manifest.family or "-",
                     model.checkpoint.manifest.rules.describe(), self.device)
            if self._on_load:
                self._on_load(name, version, "ok")
            return model, removed
        return None, removed

    def _not_ready(self, name: str, version: int, version_dir: Path, reason: str) -> None:
        """A version that fails to load within its grace time: pending, not a failure."""
        self._reasons[version_dir] = f"not ready yet (still being copied in?): {reason}"
        if self._pending.first_notice(version_dir):
            log.info("model=%s version=%d not ready yet (still being copied in?): %s; "
                     "retried every poll, refused if it stays so for %.0fs (write "
                     "manifest.json last, or copy to a temporary name and rename)", name,
                     version, reason.replace("\n", " "), self._pending.grace_seconds)

