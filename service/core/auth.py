"""Bearer tokens: the token file (one per line, with its scopes), its re-reading on change, constant-time checks.

A line is `<token>` (serving: inference and model information) or `<token> admin` (also the model repository
API); blank lines and lines starting with # are ignored.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from service.core.config import ConfigError

logger = logging.getLogger(__name__)

# Why a request was refused, the same for every protocol (never quoting what the client sent).
MISSING_TOKEN = "missing bearer token: send the header 'Authorization: Bearer <token>'"
WRONG_SCHEME = "the Authorization header must be 'Bearer <token>'"
INVALID_TOKEN = "invalid bearer token"
NOT_ADMIN = "this bearer token lacks the admin scope the model repository API needs (docs/model-management.md)"

ADMIN = "admin"
SCOPES = (ADMIN,)
Tokens = dict[bytes, frozenset[str]]  # token digest -> its scopes beyond serving

RELOAD_INTERVAL_S = 1.0  # the file is stat()ed at most this often, so a check stays a hash and a few compares
BEARER = "bearer"

# What identifies one version of the file: a Kubernetes Secret update swaps a symlink (new inode), an
# editor may rewrite in place (new size or mtime).
Signature = tuple[int, int, int, int]


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive); None for anything else."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != BEARER or not token or any(c.isspace() for c in token):
        return None
    return token


def digest(token: str) -> bytes:
    """Tokens are compared as SHA-256 digests: equal lengths, so the comparison time says nothing about them."""
    return hashlib.sha256(token.encode()).digest()


def parse_tokens(text: str) -> Tokens:
    """The digests of the file's tokens with their scopes: `<token> [scope ...]` per line; blank lines and lines
    starting with # are ignored. ValueError naming the line for an unknown scope."""
    tokens: Tokens = {}
    for number, line in enumerate(text.splitlines(), start=1):
        token, *scopes = line.split() or [""]
        if not token or token.startswith("#"):
            continue
        if unknown := sorted(set(scopes) - set(SCOPES)):
            raise ValueError(f"line {number} names the unknown scope {unknown[0]!r} (known: {', '.join(SCOPES)})")
        tokens[digest(token)] = tokens.get(digest(token), frozenset()) | frozenset(scopes)
    return tokens


def file_signature(path: Path) -> Signature:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def read_tokens(path: Path) -> tuple[Tokens, Signature]:
    """The digests (with scopes) and the signature of the version read; ConfigError when unreadable, malformed or
    without a token."""
    try:
        signature = file_signature(path)
        text = path.read_text(encoding="utf-8-sig")
        tokens = parse_tokens(text)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"cannot read the bearer token file {path} (CAPSNET_AUTH_TOKENS_FILE): {reason}") from e
    if not tokens:
        raise ConfigError(
            f"the bearer token file {path} (CAPSNET_AUTH_TOKENS_FILE) holds no token: "
            "write one token per line (blank lines and # comments are ignored)"
        )
    return tokens, signature


class TokenStore:
    """The accepted tokens, re-read when the file changes (checked at most once per `reload_interval_s`).

    A file that becomes unreadable or empty keeps the last good tokens (with a warning): a bad rotation never
    opens the service, and never locks out the clients that still hold a valid token.
    """

    def __init__(
        self,
        path: Path,
        tokens: Tokens,
        signature: Signature,
        *,
        reload_interval_s: float = RELOAD_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.reload_interval_s = reload_interval_s
        self.clock = clock
        self._tokens = tokens
        self._signature: Signature | None = signature
        self._checked_at = clock()
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: Path) -> TokenStore:
        """The tokens of `path`; ConfigError (naming the file) when it cannot be read or holds no token."""
        tokens, signature = read_tokens(path)
        logger.info("bearer token authentication on: %d token(s) from %s", len(tokens), path)
        return cls(path, tokens, signature)

    def __len__(self) -> int:
        return len(self._tokens)

    def check(self, token: str | None) -> bool:
        """Whether `token` is one of the file's tokens; compares with every token, in constant time."""
        return self.scopes(token) is not None

    def check_admin(self, token: str | None) -> bool:
        """Whether `token` is one of the file's tokens with the admin scope."""
        return ADMIN in (self.scopes(token) or ())

    def scopes(self, token: str | None) -> frozenset[str] | None:
        """The scopes of `token` (empty: serving only), None when it is not a token of the file; compares with
        every token, in constant time."""
        self.refresh()
        if token is None:
            return None
        candidate = digest(token)
        found: frozenset[str] | None = None
        for accepted, scopes in self._tokens.items():
            if hmac.compare_digest(candidate, accepted):
                found = scopes
        return found

    def refresh(self) -> None:
        """Re-read the file if its signature changed since the last look (at most once per interval)."""
        now = self.clock()
        if now - self._checked_at < self.reload_interval_s or not self._lock.acquire(blocking=False):
            return
        try:
            self._checked_at = now
            self._reload_if_changed()
        finally:
            self._lock.release()

    def _reload_if_changed(self) -> None:
        try:
            signature: Signature | None = file_signature(self.path)
        except OSError as e:
            signature = None
            if self._signature is not None:
                logger.warning("cannot stat the bearer token file %s (%s): keeping the last tokens", self.path, e)
        if signature is None or signature == self._signature:
            self._signature = signature
            return
        self._signature = signature  # a bad version is reported once, not every interval
        try:
            self._tokens, self._signature = read_tokens(self.path)
        except ConfigError as e:
            logger.warning("%s; keeping the last %d token(s)", e, len(self._tokens))
            return
        logger.info("bearer token file %s changed: %d token(s) now", self.path, len(self._tokens))
