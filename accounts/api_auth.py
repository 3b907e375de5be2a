"""DRF authentication by personal access token: `Authorization: Bearer lp_...`."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from accounts.models import PersonalAccessToken
from core import log_context


class PersonalAccessTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Any) -> tuple[Any, PersonalAccessToken] | None:
        header = authentication.get_authorization_header(request).decode(errors="replace")
        if not header:
            return None
        parts = header.split()
        if parts[0] not in (self.keyword, "Token"):
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(
                _("Send the token as 'Authorization: Bearer <token>'.")
            )
        token = PersonalAccessToken.authenticate(parts[1])
        if token is None:
            raise exceptions.AuthenticationFailed(
                _(
                    "This token is unknown, expired or revoked. Create a new one under Account → API tokens."
                )
            )
        token.touch()
        log_context.user_name.set(token.user.get_username())  # for the request's log records
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return self.keyword


class PersonalAccessTokenScheme(OpenApiAuthenticationExtension):
    """Documents the Bearer token in the OpenAPI schema (drf-spectacular finds it by import)."""

    target_class = PersonalAccessTokenAuthentication
    name = "personalAccessToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "lp_…",
            "description": "A personal access token from Account → API tokens, sent as "
            "`Authorization: Bearer lp_…`. The token acts with its owner's rights.",
        }
