from __future__ import annotations

from django.http import HttpRequest

from jobqueue.models import EmergencyRequest, PriorityGrant


def pending_approvals(request: HttpRequest) -> dict[str, int]:
    """For staff, how many grant and emergency requests await a decision (shown in the nav)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or not user.is_staff:
        return {"pending_approvals": 0}
    return {
        "pending_approvals": PriorityGrant.objects.filter(state=PriorityGrant.State.PENDING).count()
        + EmergencyRequest.objects.filter(state=EmergencyRequest.State.PENDING).count()
    }
