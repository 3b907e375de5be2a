"""Campus sign-in settings from the environment: LDAP / Active Directory and OpenID Connect.

Both are off unless their first variable is set (LABPORTAL_LDAP_URI, LABPORTAL_OIDC_SERVER_URL);
a half-done configuration stops the start with a message that names the missing variable.
docs/deployment.md ("Campus sign-in") describes each variable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from core.envvars import env_bool, env_choice, env_str, env_str_map, env_url

GROUP_TYPES = ("posix", "groupofnames", "activedirectory")
_MAP_EXAMPLE = "phd-students=PhD,masters=Master"


@dataclass(frozen=True)
class LdapLogin:
    """What settings.py needs for django-auth-ldap (its AUTH_LDAP_* settings) and the portal."""

    settings: dict[str, Any] = field(default_factory=dict)
    group_categories: dict[str, str] = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return bool(self.settings)


def ldap_login() -> LdapLogin:
    uri = env_url(
        "LABPORTAL_LDAP_URI",
        "",
        schemes=("ldap://", "ldaps://"),
        example="ldaps://ldap.campus.example.edu",
    )
    if not uri:
        for name in ("LABPORTAL_LDAP_USER_SEARCH_BASE", "LABPORTAL_LDAP_GROUP_CATEGORIES"):
            if env_str(name):
                raise ImproperlyConfigured(
                    f"{name} is set but LABPORTAL_LDAP_URI is not: set LABPORTAL_LDAP_URI "
                    "(e.g. ldaps://ldap.campus.example.edu) to turn LDAP sign-in on, or unset "
                    f"{name}."
                )
        return LdapLogin()

    # Imported only where LDAP is on: a portal without it needs no python-ldap.
    try:
        import ldap
        from django_auth_ldap.config import (
            ActiveDirectoryGroupType,
            GroupOfNamesType,
            LDAPSearch,
            PosixGroupType,
        )
    except ImportError as exc:  # make install adds them only where python-ldap can be built
        raise ImproperlyConfigured(
            f"LABPORTAL_LDAP_URI is set but django-auth-ldap cannot be imported ({exc}): "
            "install the portal's ldap extra (pip install 'labportal[ldap]'; python-ldap "
            "builds with a C compiler, libldap2-dev and libsasl2-dev)."
        ) from None

    user_base = env_str("LABPORTAL_LDAP_USER_SEARCH_BASE")
    if not user_base:
        raise ImproperlyConfigured(
            "LABPORTAL_LDAP_URI is set but LABPORTAL_LDAP_USER_SEARCH_BASE is not: set it to the "
            "directory entry the members are under, e.g. ou=people,dc=campus,dc=example,dc=edu."
        )
    user_filter = env_str("LABPORTAL_LDAP_USER_FILTER", "(uid=%(user)s)") or ""
    if "%(user)s" not in user_filter:
        raise ImproperlyConfigured(
            "LABPORTAL_LDAP_USER_FILTER must contain %(user)s where the typed user name goes, "
            f"e.g. (uid=%(user)s), or (sAMAccountName=%(user)s) for Active Directory (got {user_filter!r})."
        )
    bind_dn = env_str("LABPORTAL_LDAP_BIND_DN", "") or ""
    bind_password = env_str("LABPORTAL_LDAP_BIND_PASSWORD", "") or ""
    if bind_password and not bind_dn:
        raise ImproperlyConfigured(
            "LABPORTAL_LDAP_BIND_PASSWORD is set but LABPORTAL_LDAP_BIND_DN is not: set the DN "
            "the portal searches the directory as, e.g. cn=labportal,ou=services,dc=campus,dc=example,dc=edu."
        )
    start_tls = env_bool("LABPORTAL_LDAP_START_TLS", False)
    if start_tls and uri.startswith("ldaps://"):
        raise ImproperlyConfigured(
            "LABPORTAL_LDAP_START_TLS=true with an ldaps:// LABPORTAL_LDAP_URI: ldaps is TLS "
            "already; use ldap://… with StartTLS, or ldaps://… without it."
        )
    group_base = env_str("LABPORTAL_LDAP_GROUP_SEARCH_BASE", "") or ""
    group_type = env_choice("LABPORTAL_LDAP_GROUP_TYPE", "posix", GROUP_TYPES)
    categories = env_str_map("LABPORTAL_LDAP_GROUP_CATEGORIES", example=_MAP_EXAMPLE)
    require_group = env_str("LABPORTAL_LDAP_REQUIRE_GROUP", "") or ""
    if (categories or require_group) and not group_base:
        raise ImproperlyConfigured(
            "LABPORTAL_LDAP_GROUP_CATEGORIES or LABPORTAL_LDAP_REQUIRE_GROUP is set but "
            "LABPORTAL_LDAP_GROUP_SEARCH_BASE is not: set the entry the groups are under, "
            "e.g. ou=groups,dc=campus,dc=example,dc=edu."
        )

    options: dict[Any, Any] = {ldap.OPT_REFERRALS: 0, ldap.OPT_NETWORK_TIMEOUT: 10}
    ca_file = env_str("LABPORTAL_LDAP_CA_FILE", "") or ""
    if ca_file:
        options[ldap.OPT_X_TLS_CACERTFILE] = ca_file
        options[ldap.OPT_X_TLS_NEWCTX] = 0
    group_types = {
        "posix": PosixGroupType,
        "groupofnames": GroupOfNamesType,
        "activedirectory": ActiveDirectoryGroupType,
    }
    group_filter = {
        "posix": "(objectClass=posixGroup)",
        "groupofnames": "(objectClass=groupOfNames)",
        "activedirectory": "(objectClass=group)",
    }[group_type]
    auth: dict[str, Any] = {
        "AUTH_LDAP_SERVER_URI": uri,
        "AUTH_LDAP_BIND_DN": bind_dn,
        "AUTH_LDAP_BIND_PASSWORD": bind_password,
        "AUTH_LDAP_START_TLS": start_tls,
        "AUTH_LDAP_CONNECTION_OPTIONS": options,
        "AUTH_LDAP_USER_SEARCH": LDAPSearch(user_base, ldap.SCOPE_SUBTREE, user_filter),
        "AUTH_LDAP_USER_ATTR_MAP": {
            "first_name": "givenName",
            "last_name": "sn",
            "email": "mail",
        },
        "AUTH_LDAP_ALWAYS_UPDATE_USER": True,
        # The lock-out (accounts/lockout) counts failures; django-auth-ldap's cache of
        # group lookups would hide a group change until it expires.
        "AUTH_LDAP_CACHE_TIMEOUT": 0,
    }
    if group_base:
        auth["AUTH_LDAP_GROUP_SEARCH"] = LDAPSearch(group_base, ldap.SCOPE_SUBTREE, group_filter)
        auth["AUTH_LDAP_GROUP_TYPE"] = group_types[group_type]()
    if require_group:
        auth["AUTH_LDAP_REQUIRE_GROUP"] = require_group
    return LdapLogin(settings=auth, group_categories=categories)


def oidc_providers() -> dict[str, Any]:
    """SOCIALACCOUNT_PROVIDERS for allauth's openid_connect provider, or {} where it is off."""
    server_url = env_url(
        "LABPORTAL_OIDC_SERVER_URL",
        "",
        schemes=("https://", "http://"),
        example="https://login.campus.example.edu/realms/campus",
    )
    if not server_url:
        if env_str("LABPORTAL_OIDC_CLIENT_ID"):
            raise ImproperlyConfigured(
                "LABPORTAL_OIDC_CLIENT_ID is set but LABPORTAL_OIDC_SERVER_URL is not: set the "
                "provider's issuer URL (its /.well-known/openid-configuration is read from there)."
            )
        return {}
    for name in ("LABPORTAL_OIDC_CLIENT_ID", "LABPORTAL_OIDC_CLIENT_SECRET"):
        if not env_str(name):
            raise ImproperlyConfigured(
                f"LABPORTAL_OIDC_SERVER_URL is set but {name} is not: register the portal with "
                "the campus provider (redirect URI https://<portal>/accounts/oidc/campus/login/callback/) "
                f"and set {name} to what it gives you."
            )
    return {
        "openid_connect": {
            "OAUTH_PKCE_ENABLED": True,
            "APPS": [
                {
                    "provider_id": "campus",
                    "name": env_str("LABPORTAL_CAMPUS_NAME", "Campus") or "Campus",
                    "client_id": env_str("LABPORTAL_OIDC_CLIENT_ID"),
                    "secret": env_str("LABPORTAL_OIDC_CLIENT_SECRET"),
                    "settings": {
                        "server_url": server_url,
                        "auth_params": {
                            "scope": env_str("LABPORTAL_OIDC_SCOPES", "openid profile email")
                        },
                    },
                }
            ],
        }
    }
