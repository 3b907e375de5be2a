"""The portal's side of signed agent messages (the envelope itself: `agent.signing`).

Commands to an agent are signed with the key of every active token of its node
(the agent checks the one for its own token); reports from an agent must be
signed with the key of one active token of that node, be current, and not be
replays (nonces are remembered in the shared cache until they expire).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.cache import cache

from agent.signing import SignatureRefused, check, key_from_hash, sign_command
from cluster.models import NodeToken


def node_keys(node_name: str) -> dict[str, bytes]:
    """The signing keys of the node's active tokens, by key id (the token prefix)."""
    rows = NodeToken.objects.filter(node_name=node_name, revoked_at__isnull=True).values_list(
        "token_prefix", "token_hash"
    )
    return {prefix: key_from_hash(token_hash) for prefix, token_hash in rows}


def command_auth(*, node_name: str, task: str, args: list[Any]) -> dict[str, Any]:
    """The `auth` keyword of a command to `node.<node_name>`."""
    ttl = float(getattr(settings, "LABPORTAL_COMMAND_TTL_S", 900))
    return sign_command(node_keys(node_name), task=task, node=node_name, args=args, ttl_s=ttl)


def report_signature_refusal(
    *, node_name: str, task: str, args: list[Any], envelope: dict[str, Any]
) -> str | None:
    """None if an active token of the node signed this report and it is new; else why not."""
    kid = envelope.get("kid")
    if not isinstance(kid, str):
        return "the signature names no key ('kid')"
    rows = NodeToken.objects.filter(
        node_name=node_name, token_prefix=kid, revoked_at__isnull=True
    ).values_list("token_hash", flat=True)
    last: SignatureRefused | None = None
    for token_hash in rows:
        try:
            check(
                key_from_hash(token_hash), task=task, node=node_name, args=args, envelope=envelope
            )
        except SignatureRefused as exc:
            last = exc
            continue
        remaining = max(1, int(float(envelope["exp"]) - float(envelope["ts"])) + 1)
        if not cache.add(f"labportal:report-nonce:{envelope['nonce']}", 1, timeout=remaining):
            return "replayed: this report was already received once"
        return None
    if last is not None:
        return f"{last.reason}: {last.detail}"
    return f"no active token of this node has the key id {kid[:10]!r}"
