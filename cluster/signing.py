"""The portal's side of signed agent messages (the envelope itself: `protocol.signing`).

Commands to an agent are signed with the key of every active token of its node
(the agent checks the one for its own token); reports from an agent must be
signed with the key of one active token of that node, be current (signed no longer
than `LABPORTAL_REPORT_MAX_AGE_S` ago), and not be replays. Report nonces are kept in
the database (`ReportNonce`), inserted in the transaction of the report's effect:
the shared cache is the broker's Redis in production, where anyone who can write to
the broker could delete a nonce and replay its report, and a nonce recorded apart
from its effect would refuse the retry of a report whose effect was rolled back.

Checking a report or signing a command needs the node's keys, and agents report
many times a second across a lab, so each process keeps them for at most `NODE_KEYS_CACHE_S`
seconds. The keys stay in the process, never in the shared cache: a process
that reaches Redis (the broker) must not learn them. A token issued, revoked,
edited or deleted through the models (and the admin's revoke action) changes a
generation value in the shared cache, which every process compares on each
report and command, so it takes effect at the next one; a change that bypasses the
models (raw SQL, or a cache that was down) takes effect within the bound.
"""

from __future__ import annotations

import secrets
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from cluster.models import NodeToken, ReportNonce
from protocol.signing import SignatureRefused, check, key_from_hash, sign_command

NODE_KEYS_CACHE_S = 60.0
_GENERATION_KEY = "labportal:node-keys-generation"


class _NodeKeyCache:
    """Per process: node name -> (loaded at, generation seen, key id -> keys)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, object, dict[str, list[bytes]]]] = {}
        self._lock = threading.Lock()

    def keys(self, node_name: str, kid: str) -> list[bytes]:
        """The keys of the node's active tokens with key id `kid` (rarely more than one)."""
        return self.by_kid(node_name, need=kid).get(kid, [])

    def by_kid(self, node_name: str, need: str | None = None) -> dict[str, list[bytes]]:
        """The keys of all the node's active tokens, by key id; read again if `need` is missing."""
        generation = cache.get(_GENERATION_KEY)
        now = time.time()
        entry = self._entries.get(node_name)
        if (
            entry is not None
            and entry[1] == generation
            and 0 <= now - entry[0] < NODE_KEYS_CACHE_S
            and (need is None or need in entry[2])
        ):
            return entry[2]
        by_kid: dict[str, list[bytes]] = {}
        for prefix, token_hash in NodeToken.objects.filter(
            node_name=node_name, revoked_at__isnull=True
        ).values_list("token_prefix", "token_hash"):
            by_kid.setdefault(prefix, []).append(key_from_hash(token_hash))
        with self._lock:
            self._entries[node_name] = (now, generation, by_kid)
        return by_kid

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_node_key_cache = _NodeKeyCache()


def node_keys_changed() -> None:
    """Make every process read the node tokens again at its next report (a token changed)."""
    _node_key_cache.clear()
    cache.set(_GENERATION_KEY, secrets.token_hex(8), timeout=None)


def node_tokens_changed(**_signal: Any) -> None:
    """A node token was issued, edited, revoked or deleted: drop the cached keys now and at commit.

    Now, for this process; again at commit, so that a process that read the tokens
    between the two (seeing the old rows) does not keep them for the whole bound.
    """
    node_keys_changed()
    transaction.on_commit(node_keys_changed)


def command_auth(*, node_name: str, task: str, args: list[Any]) -> dict[str, Any]:
    """The `auth` keyword of a command to `node.<node_name>`.

    Signed with the keys this process keeps (see the module's docstring): a token
    revoked through the models stops signing at the next command.
    """
    ttl = float(getattr(settings, "LABPORTAL_COMMAND_TTL_S", 900))
    return sign_command(
        node_signing_keys(node_name), task=task, node=node_name, args=args, ttl_s=ttl
    )


def node_signing_keys(node_name: str) -> dict[str, bytes]:
    """The key of each active token of the node, by key id: what commands and gateway
    tickets (`protocol.tickets`) are signed with."""
    return {kid: found[-1] for kid, found in _node_key_cache.by_kid(node_name).items()}


def report_signature_refusal(
    *, node_name: str, task: str, args: list[Any], envelope: dict[str, Any]
) -> str | None:
    """None if an active token of the node signed this report and it is current; else why not.

    Whether it is new is `report_nonce_claim`'s to say, inside the report's transaction.
    """
    kid = envelope.get("kid")
    if not isinstance(kid, str):
        return "the signature names no key ('kid')"
    last: SignatureRefused | None = None
    for key in _node_key_cache.keys(node_name, kid):
        try:
            check(key, task=task, node=node_name, args=args, envelope=envelope)
        except SignatureRefused as exc:
            last = exc
            continue
        age = time.time() - float(envelope["ts"])
        if age > settings.LABPORTAL_REPORT_MAX_AGE_S:
            return (
                f"stale: signed {age:.0f}s ago, over LABPORTAL_REPORT_MAX_AGE_S "
                f"({settings.LABPORTAL_REPORT_MAX_AGE_S}s); check the node's clock (NTP)"
            )
        return None
    if last is not None:
        return f"{last.reason}: {last.detail}"
    return f"no active token of this node has the key id {kid[:10]!r}"


# Nonces are kept a minute past the last moment their report could be accepted, for the
# portal's own processes' clocks.
NONCE_MARGIN = timedelta(minutes=1)


def report_nonce_claim(*, node_name: str, envelope: dict[str, Any]) -> bool:
    """Record a checked report's nonce; False if it was recorded before (a replay).

    Call it inside the transaction of the report's effect: if that rolls back, so does
    the nonce, and the report's retry is accepted.
    """
    ts = float(envelope["ts"])
    last_accepted = min(float(envelope["exp"]), ts + settings.LABPORTAL_REPORT_MAX_AGE_S)
    return ReportNonce.claim(
        nonce=str(envelope["nonce"]),
        node_name=node_name,
        expires_at=datetime.fromtimestamp(last_accepted, tz=UTC) + NONCE_MARGIN,
    )


def report_nonces_prune(*, now: datetime) -> int:
    """Forget the nonces of reports that would be refused anyway (expired or stale)."""
    deleted, _by_model = ReportNonce.objects.filter(expires_at__lt=now).delete()
    return deleted
