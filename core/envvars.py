"""Strict readers for LabPortal's environment variables.

Every reader names the variable and the accepted values when a value is bad, so
that an operator can fix the deployment from the error message alone.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Iterable
from email.utils import getaddresses

from django.core.exceptions import ImproperlyConfigured

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def env_str(name: str, default: str | None = None) -> str | None:
    """The raw value of `name`, or `default` when unset or empty."""
    value = os.environ.get(name, "").strip()
    return value if value else default


def env_bool(name: str, default: bool) -> bool:
    """A boolean; accepts true/false, 1/0, yes/no, on/off in any case."""
    raw = env_str(name)
    if raw is None:
        return default
    lowered = raw.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be one of: {', '.join(_TRUE + _FALSE)} (got {raw!r}).")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    """An integer, optionally with a lower bound."""
    raw = env_str(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number (got {raw!r}).") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum} (got {value}).")
    return value


def env_choice(name: str, default: str, choices: Iterable[str]) -> str:
    """One of a fixed set of words."""
    allowed = tuple(choices)
    raw = env_str(name)
    if raw is None:
        return default
    if raw not in allowed:
        raise ImproperlyConfigured(f"{name} must be one of: {', '.join(allowed)} (got {raw!r}).")
    return raw


def env_list(name: str, default: list[str]) -> list[str]:
    """A comma-separated list; blanks are dropped."""
    raw = env_str(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def _pairs(name: str, *, example: str, what: str, ok: Callable[[str], bool]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in env_list(name, []):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not ok(value.strip()):
            raise ImproperlyConfigured(
                f"{name} must be comma-separated key={what} pairs, e.g. {example} (got {item!r})."
            )
        pairs[key.strip().lower()] = value.strip()
    return pairs


def env_int_map(name: str, *, example: str) -> dict[str, int]:
    """Comma-separated ``key=whole number`` pairs (keys lower-cased), e.g. ``a100=81920``."""
    pairs = _pairs(name, example=example, what="number", ok=str.isdigit)
    return {key: int(value) for key, value in pairs.items()}


def env_str_map(name: str, *, example: str) -> dict[str, str]:
    """Comma-separated ``key=value`` pairs (keys lower-cased), e.g. ``NVIDIA A100=a100``."""
    return _pairs(name, example=example, what="value", ok=bool)


def env_required(name: str, *, why: str) -> str:
    """A value that must be set; `why` says when it is needed."""
    raw = env_str(name)
    if raw is None:
        raise ImproperlyConfigured(f"{name} is not set. {why}")
    return raw


def env_url(name: str, default: str, *, schemes: Iterable[str], example: str) -> str:
    """A URL whose scheme is one of `schemes` (each given with its `://`)."""
    allowed = tuple(schemes)
    raw = env_str(name)
    if raw is None:
        return default
    if not raw.startswith(allowed):
        raise ImproperlyConfigured(
            f"{name} must start with {', '.join(allowed)} (got {raw!r}); e.g. {name}={example}"
        )
    return raw


def env_networks(
    name: str, default: list[str]
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """A comma-separated list of IP addresses or networks in CIDR notation."""
    networks = []
    for item in env_list(name, default):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"{name} must be IP addresses or networks, comma-separated, "
                f"e.g. {name}=127.0.0.1,10.0.0.0/8 (got {item!r})."
            ) from None
    return tuple(networks)


def admins_from(value: str | None) -> list[tuple[str, str]]:
    """ADMINS="Ann Lee <ann@lab.example.org>, ops@lab.example.org" as Django's (name, email)
    pairs; an entry without an @ is refused with the form to use."""
    if not value or not value.strip():
        return []
    admins = []
    for name, email in getaddresses([value]):
        if "@" not in email:
            raise ImproperlyConfigured(
                f"ADMINS has an entry without an email address ({name or email!r}); write it "
                'as ADMINS="Ann Lee <ann@lab.example.org>, ops@lab.example.org"'
            )
        admins.append((name or email, email))
    return admins


def sample_rate_from(value: str | None) -> float:
    """SENTRY_TRACES_SAMPLE_RATE: the share of requests traced, 0 (the default) to 1."""
    if not value:
        return 0.0
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        raise ImproperlyConfigured(
            f"SENTRY_TRACES_SAMPLE_RATE must be a number from 0 to 1 (got {value!r}), "
            "e.g. SENTRY_TRACES_SAMPLE_RATE=0.05 to trace one request in twenty"
        )
    return rate


def env_admins(name: str) -> list[tuple[str, str]]:
    return admins_from(env_str(name))


def env_sample_rate(name: str) -> float:
    return sample_rate_from(env_str(name))
