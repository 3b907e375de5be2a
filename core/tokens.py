"""Secrets handed out once and stored only as their SHA-256 (API and node tokens)."""

from __future__ import annotations

import hashlib
import secrets


def new_secret(prefix: str) -> str:
    """A fresh URL-safe secret with a recognisable prefix (lp_, lpn_)."""
    return prefix + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    """What the database keeps: a high-entropy secret needs no salt or slow hash."""
    return hashlib.sha256(secret.encode()).hexdigest()
