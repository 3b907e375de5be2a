"""Login lockout: failed sign-ins counted per account and per client address.

The counters live in the shared cache (Redis in production), so every web
worker sees the same count. An account, or an address, that reaches its limit
of failures within LABPORTAL_LOGIN_LOCKOUT_S is locked for that long; the
sign-in page says for how much longer. The two are counted separately, so that
one address guessing passwords neither locks out other members elsewhere nor
gets more guesses by spreading them over many accounts.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import time
from dataclasses import dataclass
from typing import Literal

from django.conf import settings
from django.core.cache import cache
from django.db.models import Q
from django.http import HttpRequest
from django.utils.translation import ngettext

from accounts.models import User

Scope = Literal["account", "address"]
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Lockout:
    scope: Scope
    seconds_left: int

    @property
    def message(self) -> str:
        minutes = max(1, math.ceil(self.seconds_left / 60))
        if self.scope == "account":
            return ngettext(
                "Too many failed sign-ins for this account. It is locked for %(minutes)d more minute; try again then.",
                "Too many failed sign-ins for this account. It is locked for %(minutes)d more minutes; try again then.",
                minutes,
            ) % {"minutes": minutes}
        return ngettext(
            "Too many failed sign-ins from your network address. Sign-ins from it are paused for %(minutes)d more minute.",
            "Too many failed sign-ins from your network address. Sign-ins from it are paused for %(minutes)d more minutes.",
            minutes,
        ) % {"minutes": minutes}


def _trusted(address: IpAddress) -> bool:
    return any(address in network for network in settings.LABPORTAL_TRUSTED_PROXIES)


def _parse(raw: str) -> IpAddress | None:
    try:
        address = ipaddress.ip_address(raw.strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def client_address(request: HttpRequest) -> str:
    """The client's address: REMOTE_ADDR, or from a trusted proxy the nearest untrusted hop
    of X-Forwarded-For. An IPv6 client counts as its /64, which one host usually owns whole."""
    address = _parse(request.META.get("REMOTE_ADDR", ""))
    if address is None:
        return "unknown"
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if forwarded and _trusted(address):
        for hop in reversed(forwarded.split(",")):
            hop_address = _parse(hop)
            if hop_address is None:
                break  # not an address: believe nothing further left
            address = hop_address
            if not _trusted(hop_address):
                break
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network(f"{address}/64", strict=False).network_address)
    return str(address)


def _account_of(login: str) -> str:
    """One key per account, whether the member typed the username or the e-mail address."""
    login = login.strip()
    user_id = (
        User.objects.filter(Q(username__iexact=login) | Q(email__iexact=login))
        .values_list("pk", flat=True)
        .first()
        if login
        else None
    )
    return f"user:{user_id}" if user_id is not None else f"login:{login.lower()}"


def _key(kind: str, scope: Scope, value: str) -> str:
    digest = hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()
    return f"login-lockout:{kind}:{scope}:{digest}"


def _subjects(login: str, address: str) -> list[tuple[Scope, str, int]]:
    return [
        ("account", _account_of(login), settings.LABPORTAL_LOGIN_FAILURES_PER_ACCOUNT),
        ("address", address, settings.LABPORTAL_LOGIN_FAILURES_PER_ADDRESS),
    ]


def login_lockout(*, login: str, address: str) -> Lockout | None:
    """The lockout that refuses this sign-in now, if any (the account's first)."""
    now = time.time()
    for scope, value, _limit in _subjects(login, address):
        until = cache.get(_key("until", scope, value))
        if until is not None and until > now:
            return Lockout(scope=scope, seconds_left=math.ceil(until - now))
    return None


def login_failure_record(*, login: str, address: str) -> Lockout | None:
    """Count a failed sign-in for the account and the address; lock either at its limit."""
    window = settings.LABPORTAL_LOGIN_LOCKOUT_S
    locked = None
    for scope, value, limit in _subjects(login, address):
        key = _key("failures", scope, value)
        cache.add(key, 0, timeout=window)
        try:
            failures = cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, timeout=window)
            failures = 1
        if failures >= limit:
            cache.set(_key("until", scope, value), time.time() + window, timeout=window)
            cache.delete(key)
            locked = locked or Lockout(scope=scope, seconds_left=window)
    return locked


def login_success_record(*, login: str) -> None:
    """A right password forgets the account's failures (not the address's: an attacker
    could otherwise sign in to an own account between guesses)."""
    cache.delete(_key("failures", "account", _account_of(login)))
