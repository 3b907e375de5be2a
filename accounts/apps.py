from typing import Any

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class AccountsConfig(AppConfig):
    name = "accounts"
    verbose_name = _("People")

    def ready(self) -> None:
        from django.db.models.signals import post_save

        from accounts.models import User

        post_save.connect(_first_grant, sender=User, dispatch_uid="accounts.first_grant")


def _first_grant(sender: Any, instance: Any, created: bool, raw: bool = False, **_kw: Any) -> None:
    """A member created approved and active (by an admin, a campus sign-in, an open sign-up)
    gets this month's grant at once; an approval later grants through the admin action."""
    if created and not raw and instance.is_active and instance.approval == sender.Approval.APPROVED:
        from accounts.services import grant_when_committed

        grant_when_committed([instance.pk])
