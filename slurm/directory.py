"""A directory sign-in gives a member without one the unix login their Slurm jobs run as.

The name is the directory entry's own (LDAP ``uid`` / ``sAMAccountName``, OIDC
``preferred_username``): the account the campus created for them on the cluster. A login
staff already set is never changed, and a name another member holds is not taken.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ValidationError

from accounts.directory import directory_login
from slurm.models import UnixLogin, unix_name_validator

log = logging.getLogger(__name__)


def take_unix_login(sender: Any, *, user: Any, unix_name: str, **kwargs: Any) -> None:
    if not unix_name:
        return
    try:
        unix_name_validator(unix_name)
    except ValidationError:
        log.warning("directory login name %r of %s is no unix user name", unix_name, user)
        return
    existing = UnixLogin.objects.filter(user=user).first()
    if existing is not None:
        if existing.username != unix_name:
            log.info(
                "%s signs in as directory user %r; their unix login stays %r (set by staff)",
                user,
                unix_name,
                existing.username,
            )
        return
    if UnixLogin.objects.filter(username=unix_name).exists():
        log.warning(
            "directory user %r: unix login %r is another member's; %s gets none",
            user.username,
            unix_name,
            user,
        )
        return
    UnixLogin.objects.create(user=user, username=unix_name)


def connect() -> None:
    directory_login.connect(take_unix_login, dispatch_uid="slurm.directory.take_unix_login")
