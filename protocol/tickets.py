"""Short-lived tickets with which the portal opens a path through a node's gateway.

The portal authenticates the member (session cookie, owner or staff) and then calls
the agent's gateway on the node, for one job and one purpose, with a ticket in the
``X-LabPortal-Ticket`` header. The ticket is an HMAC under the node's signing key
(the same key as ``protocol.signing``: derived from the node token's hash, which is
all the portal stores), so the gateway needs no database and nobody who can reach
its port can use it without the portal. A ticket names the node, the job, the
attempt, the purpose (``http`` for the proxied server, ``exec`` for a shell in the
job, ``probe`` for readiness and activity) and expires within a minute; it is not
single-use, since one page load makes many requests.

Format: ``v1.<payload b64url>.<kid>=<sig hex>~<kid>=<sig hex>…`` where payload is
canonical JSON ``{"node", "job", "attempt", "purpose", "exp", "user"}``: one signature per
active token of the node, as broker commands carry, so a ticket still opens the gateway
while the node's token is being rotated and the agent holds either one. Pure Python: the
agent and the portal import it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any, Literal

from protocol.signing import MAX_CLOCK_SKEW_S, canonical

HEADER = "X-LabPortal-Ticket"
# Sent by the portal's own status reads of a session's server (its idle culler): such a
# request is not the member's activity. The portal's proxy never forwards it from a browser.
PROBE_HEADER = "X-LabPortal-Probe"
TICKET_CONTEXT = b"labportal-gateway-ticket-v1"
DEFAULT_TTL_S = 60.0
MAX_TTL_S = 600.0
Purpose = Literal["http", "exec", "probe"]
PURPOSES: frozenset[str] = frozenset({"http", "exec", "probe"})


class TicketRefused(Exception):
    """The ticket is missing, malformed, forged, for another job or purpose, or expired."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _ticket_key(signing_key: bytes) -> bytes:
    # A key of its own: a ticket can never pass for a broker envelope, nor the reverse.
    return hmac.new(signing_key, TICKET_CONTEXT, hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def issue(
    keys: dict[str, bytes],
    *,
    node: str,
    job_id: int,
    attempt: int,
    purpose: Purpose,
    user: str,
    ttl_s: float = DEFAULT_TTL_S,
    now: float | None = None,
) -> str:
    """A ticket signed with each of the node's active keys (``{kid: signing key}``)."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown ticket purpose {purpose!r}")
    if not keys:
        raise ValueError("the node has no active token to sign with")
    exp = round((time.time() if now is None else now) + min(ttl_s, MAX_TTL_S), 3)
    payload = canonical(
        {
            "node": node,
            "job": int(job_id),
            "attempt": int(attempt),
            "purpose": purpose,
            "exp": exp,
            "user": user,
        }
    )
    body = _b64(payload)
    sigs = "~".join(f"{kid}={_sign(key, body)}" for kid, key in sorted(keys.items()))
    return f"v1.{body}.{sigs}"


def _sign(key: bytes, body: str) -> str:
    return hmac.new(_ticket_key(key), body.encode(), hashlib.sha256).hexdigest()


def verify(
    key: bytes,
    kid: str,
    ticket: str | None,
    *,
    node: str,
    job_id: int,
    purpose: Purpose,
    now: float | None = None,
) -> dict[str, Any]:
    """The ticket's payload, or ``TicketRefused`` saying why not. The agent's side."""
    if not ticket:
        raise TicketRefused("missing", f"no {HEADER} header")
    parts = ticket.split(".")
    if len(parts) != 3 or parts[0] != "v1":
        raise TicketRefused("malformed", "a ticket is v1.<payload>.<kid>=<signature>…")
    _, body, signed = parts
    sigs = dict(pair.partition("=")[::2] for pair in signed.split("~"))
    sig = sigs.get(kid)
    if sig is None:
        raise TicketRefused("bad_signature", "not signed with this node's token")
    if not hmac.compare_digest(_sign(key, body), sig):
        raise TicketRefused("bad_signature", "the signature does not match the ticket")
    try:
        payload = json.loads(_unb64(body))
    except (ValueError, TypeError):
        raise TicketRefused("malformed", "the payload is not JSON") from None
    if not isinstance(payload, dict):
        raise TicketRefused("malformed", "the payload must be an object")
    if payload.get("node") != node:
        raise TicketRefused("wrong_node", f"the ticket is for node {payload.get('node')!r}")
    if payload.get("job") != job_id:
        raise TicketRefused("wrong_job", f"the ticket is for job {payload.get('job')!r}")
    if payload.get("purpose") != purpose:
        raise TicketRefused("wrong_purpose", f"the ticket is for {payload.get('purpose')!r}")
    exp = payload.get("exp")
    if not isinstance(exp, (int, float)) or isinstance(exp, bool):
        raise TicketRefused("malformed", "'exp' must be a number")
    now = time.time() if now is None else now
    if exp > now + MAX_TTL_S + MAX_CLOCK_SKEW_S:
        raise TicketRefused("expired", "the ticket claims too long a life")
    if now > exp:
        raise TicketRefused("expired", f"expired {now - exp:.0f}s ago")
    return payload
