"""Secrets handed out once and stored only as their SHA-256 (API and node tokens), and
URL tokens derived with a server key from a secret that is never shown (calendar feeds)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets


def new_secret(prefix: str) -> str:
    """A fresh URL-safe secret with a recognisable prefix (lp_, lpn_)."""
    return prefix + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    """What the database keeps: a high-entropy secret needs no salt or slow hash."""
    return hashlib.sha256(secret.encode()).hexdigest()


def keyed_digest(key: str, *parts: str) -> str:
    """HMAC-SHA256 under ``key`` of ``parts``, URL-safe base64 without padding.

    The parts are joined with NUL, which none of them may contain, so that
    ("1", "2x") and ("12", "x") give different digests.
    """
    if any("\x00" in part for part in parts):
        raise ValueError("a part of a keyed digest may not contain NUL")
    mac = hmac.new(key.encode(), "\x00".join(parts).encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")


def digests_match(given: str, expected: str) -> bool:
    """Constant-time comparison of a digest from a request with the expected one."""
    return hmac.compare_digest(given.encode(), expected.encode())
