"""Abstract models every app may build on (core/ is no app: nothing here has a table)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models

from core.tokens import hash_secret, new_secret


class HashedToken(models.Model):
    """A secret handed out once and stored only as its SHA-256, with the first characters
    kept to tell tokens apart (API tokens ``lp_``, node tokens ``lpn_``, scrape ``lpm_``)."""

    PREFIX: ClassVar[str] = "lp_"

    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_prefix = models.CharField(max_length=12, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    @staticmethod
    def hash_secret(secret: str) -> str:
        return hash_secret(secret)

    @classmethod
    def new_secret(cls) -> tuple[str, dict[str, Any]]:
        """A fresh secret, and the fields that store it (its hash and its prefix)."""
        secret = new_secret(cls.PREFIX)
        return secret, {"token_hash": hash_secret(secret), "token_prefix": secret[:10]}
