"""Members from the campus directory: LDAP / Active Directory and OpenID Connect sign-in.

A directory sign-in creates the member on first use and, on every sign-in, sets
- the category that the first of the member's groups listed in the mapping names
  (LABPORTAL_LDAP_GROUP_CATEGORIES, LABPORTAL_OIDC_GROUP_CATEGORIES: ``group=Category``);
  a member in none of the mapped groups keeps the category an admin gave;
- the unix uid/gid from the entry's ``uidNumber``/``gidNumber`` (containers run as it), and
  tells the layers above (``directory_login``) the unix login name, which Slurm mode's
  UnixLogin takes.

The lock-out (accounts/lockout) applies as to a local password: the directory backend is
asked through the same allauth sign-in form and adapter.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.dispatch import Signal
from django.http import HttpRequest

from accounts.models import Category, User

log = logging.getLogger(__name__)

# Sent after a directory sign-in with user= and unix_name= (the entry's uid, '' if none).
directory_login = Signal()


class DirectoryConflict(Exception):
    """The directory's uidNumber is another member's uid here."""


def mapped_category(groups: Iterable[str], mapping: dict[str, str]) -> Category | None:
    """The category of the first mapping entry the member's groups hold (names compared
    case-insensitively), or None. A mapped name without its category is logged."""
    held = {group.lower() for group in groups}
    for group, name in mapping.items():
        if group.lower() in held:
            category = Category.objects.filter(name=name).first()
            if category is None:
                log.error(
                    "directory group %r maps to category %r, which does not exist: create it "
                    "in the admin or correct the mapping",
                    group,
                    name,
                )
            return category
    return None


def _number(value: Any) -> int | None:
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def apply_directory(
    user: User,
    *,
    groups: Iterable[str],
    mapping: dict[str, str],
    uid_number: Any = None,
    gid_number: Any = None,
    unix_name: str = "",
) -> None:
    """Bring a member in line with the directory (see the module's doc) and save."""
    changed: list[str] = []
    category = mapped_category(groups, mapping)
    if category is not None and user.category_id != category.pk:
        user.category = category
        changed.append("category")
    uid = _number(uid_number)
    if uid is not None and user.unix_uid != uid:
        if User.objects.filter(unix_uid=uid).exclude(pk=user.pk).exists():
            raise DirectoryConflict(
                f"uidNumber {uid} of directory user {user.username!r} is already another "
                "member's unix uid in the portal"
            )
        user.unix_uid = uid
        changed.append("unix_uid")
    gid = _number(gid_number)
    if uid is not None and user.unix_gid != (gid if gid is not None else uid):
        user.unix_gid = gid if gid is not None else uid
        changed.append("unix_gid")
    if changed:
        user.save(update_fields=changed)
    directory_login.send(sender=User, user=user, unix_name=unix_name)


def _first(attrs: dict[str, list[str]], name: str) -> str:
    values = attrs.get(name.lower()) or []
    return str(values[0]) if values else ""


try:
    from django_auth_ldap.backend import LDAPBackend
except ImportError:  # the ldap extra is not installed: settings never name the backend
    LDAPBackend = object


class DirectoryBackend(LDAPBackend):  # LDAPBackend is untyped
    """django-auth-ldap's backend, with the category and unix ids of the module's doc."""

    def authenticate_ldap_user(self, ldap_user: Any, password: str) -> Any:
        user = super().authenticate_ldap_user(ldap_user, password)
        if user is None:
            return None
        attrs = {key.lower(): value for key, value in (ldap_user.attrs or {}).items()}
        unix_name = _first(attrs, "uid") or _first(attrs, "sAMAccountName")
        try:
            apply_directory(
                user,
                groups=ldap_user.group_names if settings.LABPORTAL_LDAP_GROUP_CATEGORIES else (),
                mapping=settings.LABPORTAL_LDAP_GROUP_CATEGORIES,
                uid_number=_first(attrs, "uidNumber") or None,
                gid_number=_first(attrs, "gidNumber") or None,
                unix_name=unix_name.lower(),
            )
        except DirectoryConflict as exc:
            log.error("directory sign-in refused: %s; correct the member's uid in the admin", exc)
            return None
        return user


def oidc_groups(extra_data: dict[str, Any]) -> list[str]:
    """The groups claim of an OpenID Connect sign-in (userinfo or id_token)."""
    claim = settings.LABPORTAL_OIDC_GROUPS_CLAIM
    found: list[str] = []
    for part in ("userinfo", "id_token"):
        value = (extra_data.get(part) or {}).get(claim)
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            found += [str(group) for group in value]
    return found


def apply_oidc(request: HttpRequest | None, user: User, extra_data: dict[str, Any]) -> None:
    claims: dict[str, Any] = {
        **(extra_data.get("id_token") or {}),
        **(extra_data.get("userinfo") or {}),
    }
    apply_directory(
        user,
        groups=oidc_groups(extra_data),
        mapping=settings.LABPORTAL_OIDC_GROUP_CATEGORIES,
        uid_number=claims.get("uidNumber") or claims.get("uid_number"),
        gid_number=claims.get("gidNumber") or claims.get("gid_number"),
        unix_name=str(claims.get("preferred_username") or "").lower(),
    )
