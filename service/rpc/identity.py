"""Who is calling: the identity a request acts as, from its bearer token or its certificate.

Identities own shared-memory regions (``service.engine.shm``): a client sees, writes and
unregisters only the regions its own identity registered.

- ``--auth-token T``: one shared token; every caller that presents it is ``"default"``.
- ``--auth-tokens FILE``: one client per line, ``name token`` (``#`` comments and blank
  lines ignored); the caller presenting ``token`` is ``name``. The file is re-read when its
  mtime, size or inode change, looked at no more than once a second, so tokens can be added
  or revoked without a restart; a file that no longer parses keeps the previous table (one
  log line) rather than locking everyone out.
- mutual TLS without tokens (``--tls-client-ca``): the client certificate's subject
  (``x509_subject``, else its common name) is the identity.
- none of these: every caller is ``""``: a single-tenant server, one namespace.

With a token configured a request without a valid one has no identity and the frame refuses
it (UNAUTHENTICATED). Tokens are compared by their sha256 digest (a dict lookup on a hash
reveals nothing about the token's bytes).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DEFAULT_IDENTITY", "Identities", "parse_tokens"]

DEFAULT_IDENTITY = "default"  # the identity of the single --auth-token
RELOAD_CHECK_S = 1.0  # the token file's stat is looked at no more often than this
_BEARER = "Bearer "
log = logging.getLogger("service.identity")


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def parse_tokens(text: str, where: str = "auth tokens") -> dict[bytes, str]:
    """``name token`` lines → {sha256(token): name}; ValueError names the bad line."""
    table: dict[bytes, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[0].isprintable() or len(parts[0]) > 128:
            raise ValueError(f"{where}:{number}: expected 'name token'")
        name, token = parts
        digest = _digest(token)
        if digest in table:
            raise ValueError(f"{where}:{number}: this token is already given to "
                             f"{table[digest]!r}")
        table[digest] = name
    return table


class Identities:
    """Resolves a caller's identity; ``required`` when any token is configured."""

    def __init__(self, auth_token: str = "", tokens_file: str = "",
                 tls_subject: bool = False) -> None:
        self._static: dict[bytes, str] = {}
        if auth_token:
            self._static[_digest(auth_token)] = DEFAULT_IDENTITY
        self._file = Path(tokens_file) if tokens_file else None
        self._from_file: Mapping[bytes, str] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._checked = 0.0
        if self._file is not None:
            self._reload(initial=True)  # a bad file at start-up stops the server
        self.required = bool(self._static) or self._file is not None
        self.tls_subject = tls_subject and not self.required

    def resolve(self, authorization: str, auth_context: Mapping[str, object] | None = None
                ) -> str:
        """The caller's identity, or "" (anonymous: refused when ``required``)."""
        if self.required:
            if not authorization.startswith(_BEARER):
                return ""
            self._maybe_reload()
            digest = _digest(authorization[len(_BEARER):])
            return self._static.get(digest) or self._from_file.get(digest, "")
        if self.tls_subject and auth_context:
            for key in ("x509_subject", "x509_common_name"):
                values = auth_context.get(key)
                if isinstance(values, list | tuple) and values:
                    value = values[0]
                    return value.decode("utf-8", "replace") if isinstance(value, bytes) \
                        else str(value)
        return ""

    # -- the token file --------------------------------------------------------------------

    def _maybe_reload(self) -> None:
        if self._file is None:
            return
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_S:
            return
        self._checked = now
        self._reload()

    def _reload(self, initial: bool = False) -> None:
        assert self._file is not None
        try:
            st = os.stat(self._file)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp:
                return
            table = parse_tokens(self._file.read_text(), str(self._file))
        except (OSError, ValueError, UnicodeDecodeError) as e:
            if initial:
                raise ValueError(f"auth_tokens: {e}") from e
            if self._stamp is not None:
                log.error("auth tokens file %s not reloaded (keeping %d tokens): %s",
                          self._file, len(self._from_file), e)
                self._stamp = None  # log once per change, not once a second
            return
        self._from_file, self._stamp = table, stamp
        if not initial:
            log.info("auth tokens file %s reloaded: %d tokens", self._file, len(table))
