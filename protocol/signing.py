"""Signed messages between the portal and its node agents (both directions).

Every message on the broker carries an envelope ``{"v", "kid", "ts", "exp",
"nonce", "sig"}``: an HMAC-SHA256 over the task name, the node, the arguments
(canonical JSON), the times and a random nonce. The key is per node token and
is derived from the token's SHA-256, which is all the portal stores; the token
itself never travels on the broker. So a process that can read or write the
broker (a job that reached Redis, say) can neither forge a command to an agent
nor a report to the portal, and a captured message is refused once replayed or
expired.

Pure Python: the agent imports this without Django, and the portal imports it too,
so both sides compute exactly the same bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

VERSION = 1
KEY_CONTEXT = b"labportal-node-signing-v1"
# How far a sender's clock may run ahead of the receiver's.
MAX_CLOCK_SKEW_S = 120.0
# No envelope may claim a longer life than this, whatever its sender says.
MAX_TTL_S = 7 * 24 * 3600.0
# Commands to an agent expire quickly: a start that waited longer is re-sent
# fresh by the portal, which re-checks the job first.
COMMAND_TTL_S = 15 * 60.0
# Reports may wait in the broker through a control-worker outage; their effects
# are idempotent (event ids), so a longer life loses nothing.
REPORT_TTL_S = 24 * 3600.0
# A heartbeat says the node is alive now: one that waited longer than this is refused,
# and the portal keeps its nonce no longer.
HEARTBEAT_TTL_S = 300.0


class SignatureRefused(Exception):
    """The envelope is missing, malformed, forged, expired or replayed."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def token_hash(token: str) -> str:
    """The SHA-256 the portal stores for a node token (``core.tokens.hash_secret``)."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_kid(token: str) -> str:
    """The key id: the token's public prefix, as the portal shows it in the admin."""
    return token[:10]


def key_from_hash(hash_hex: str) -> bytes:
    return hmac.new(hash_hex.encode(), KEY_CONTEXT, hashlib.sha256).digest()


def key_from_token(token: str) -> bytes:
    return key_from_hash(token_hash(token))


def canonical(value: Any) -> bytes:
    """The bytes that are signed: JSON with sorted keys, as the broker would carry it."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _mac(key: bytes, *, task: str, node: str, args: Any, ts: float, exp: float, nonce: str) -> str:
    body = canonical(
        {"task": task, "node": node, "args": args, "ts": ts, "exp": exp, "nonce": nonce}
    )
    return hmac.new(key, body, hashlib.sha256).hexdigest()


def _stamp(ttl_s: float, now: float | None) -> tuple[float, float, str]:
    ts = round(time.time() if now is None else now, 3)
    return ts, round(ts + ttl_s, 3), secrets.token_hex(16)


def sign(
    key: bytes,
    *,
    kid: str,
    task: str,
    node: str,
    args: Any,
    ttl_s: float,
    now: float | None = None,
) -> dict[str, Any]:
    """The envelope for one message. ``args`` must be what the receiver will see (JSON types)."""
    ts, exp, nonce = _stamp(ttl_s, now)
    plain = json.loads(canonical(args))
    sig = _mac(key, task=task, node=node, args=plain, ts=ts, exp=exp, nonce=nonce)
    return {"v": VERSION, "kid": kid, "ts": ts, "exp": exp, "nonce": nonce, "sig": sig}


def check(
    key: bytes, *, task: str, node: str, args: Any, envelope: Any, now: float | None = None
) -> dict[str, Any]:
    """Raise ``SignatureRefused`` unless ``envelope`` signs exactly this message and is current.

    Does not check replay: the caller keeps the nonces it has seen (``NonceLedger``).
    """
    if envelope is None:
        raise SignatureRefused("unsigned", "the message carries no signature")
    if not isinstance(envelope, dict):
        raise SignatureRefused("malformed", "the signature must be an object")
    if envelope.get("v") != VERSION:
        raise SignatureRefused("malformed", f"unknown signature version {envelope.get('v')!r}")
    raw_ts, raw_exp, nonce, sig = (envelope.get(k) for k in ("ts", "exp", "nonce", "sig"))
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (raw_ts, raw_exp)):
        raise SignatureRefused("malformed", "'ts' and 'exp' must be numbers")
    ts, exp = float(raw_ts), float(raw_exp)  # type: ignore[arg-type]
    if not (isinstance(nonce, str) and 16 <= len(nonce) <= 64):
        raise SignatureRefused("malformed", "'nonce' must be a string of 16 to 64 characters")
    if not (isinstance(sig, str) and len(sig) == 64):
        raise SignatureRefused("malformed", "'sig' must be a hex SHA-256 HMAC")
    expected = _mac(key, task=task, node=node, args=args, ts=ts, exp=exp, nonce=nonce)
    if not hmac.compare_digest(expected, sig):
        raise SignatureRefused("bad_signature", "the signature does not match the message")
    now = time.time() if now is None else now
    if exp - ts > MAX_TTL_S or exp < ts:
        raise SignatureRefused("expired", f"a lifetime of {exp - ts:.0f}s is not allowed")
    if ts > now + MAX_CLOCK_SKEW_S:
        raise SignatureRefused(
            "clock_skew",
            f"signed {ts - now:.0f}s in the future; keep the portal's and the nodes' clocks "
            "in step (NTP)",
        )
    if now > exp:
        raise SignatureRefused("expired", f"expired {now - exp:.0f}s ago")
    return envelope


class NonceLedger:
    """The nonces seen and not yet expired; optionally kept in a file across restarts."""

    def __init__(self, path: Path | None = None, clock: Callable[[], float] = time.time) -> None:
        self._path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}
        if path is not None and path.exists():
            try:
                loaded = json.loads(path.read_text())
                self._seen = {str(k): float(v) for k, v in loaded.items()}
            except (OSError, ValueError, AttributeError):
                self._seen = {}

    def claim(self, nonce: str, exp: float) -> bool:
        """True the first time a nonce is presented before it expires; False on a replay."""
        with self._lock:
            now = self._clock()
            self._seen = {n: e for n, e in self._seen.items() if e >= now}
            if nonce in self._seen:
                return False
            self._seen[nonce] = exp
            self._save()
            return True

    def _save(self) -> None:
        if self._path is None:
            return
        tmp = self._path.with_suffix(".tmp")
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self._seen))
            tmp.replace(self._path)
        except OSError:
            pass  # replay protection then lasts for this process's life only


class CommandVerifier:
    """The agent's check of every command from the portal: signed, current, not replayed."""

    def __init__(
        self,
        token: str,
        node: str,
        ledger: NonceLedger | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key = key_from_token(token)
        self._kid = token_kid(token)
        self._node = node
        self._ledger = ledger or NonceLedger(clock=clock)
        self._clock = clock

    def verify(self, task: str, args: list[Any], envelope: Any) -> None:
        if isinstance(envelope, dict) and "sigs" in envelope:
            # The portal signs once per active token of the node; ours is under our kid.
            sigs = envelope.get("sigs")
            if not isinstance(sigs, dict) or self._kid not in sigs:
                raise SignatureRefused("bad_signature", "not signed with this node's token")
            envelope = {**envelope, "sig": sigs[self._kid]}
        check(
            self._key,
            task=task,
            node=self._node,
            args=json.loads(canonical(args)),
            envelope=envelope,
            now=self._clock(),
        )
        if not self._ledger.claim(str(envelope["nonce"]), float(envelope["exp"])):
            raise SignatureRefused("replayed", "this message was already received once")


def sign_command(
    keys: dict[str, bytes], *, task: str, node: str, args: list[Any], ttl_s: float = COMMAND_TTL_S
) -> dict[str, Any]:
    """A portal command signed with every active token's key of the node (keys by kid)."""
    ts, exp, nonce = _stamp(ttl_s, None)
    plain = json.loads(canonical(args))
    sigs = {
        kid: _mac(key, task=task, node=node, args=plain, ts=ts, exp=exp, nonce=nonce)
        for kid, key in sorted(keys.items())
    }
    return {"v": VERSION, "ts": ts, "exp": exp, "nonce": nonce, "sigs": sigs}
