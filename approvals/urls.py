"""Approval pages, mounted under /jobs/ by labportal/urls.py."""

from django.urls import path

from approvals import views as approval_views

urlpatterns = [
    path("grants/apply/", approval_views.grant_apply, name="grant_apply"),
    path("grants/<int:pk>/withdraw/", approval_views.grant_withdraw, name="grant_withdraw"),
    path("emergencies/apply/", approval_views.emergency_apply, name="emergency_apply"),
    path("approvals/", approval_views.approvals_queue, name="approvals"),
    path("approvals/grants/<int:pk>/decide/", approval_views.grant_decide, name="grant_decide"),
    path(
        "approvals/emergencies/<int:pk>/decide/",
        approval_views.emergency_decide,
        name="emergency_decide",
    ),
]
