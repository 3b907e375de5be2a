from django.urls import path

from accounts import views

urlpatterns = [
    path("tokens/", views.token_list, name="token_list"),
    path("tokens/<int:pk>/revoke/", views.token_revoke, name="token_revoke"),
    path("credits/", views.credits, name="credits"),
    path("credits/summary/", views.credits_summary, name="credits_summary"),
    path("notifications/", views.notifications, name="notifications"),
    path("notifications/bell/", views.notification_bell, name="notification_bell"),
    path("notifications/read/", views.notifications_read, name="notifications_read"),
    path("notifications/settings/", views.notification_settings, name="notification_settings"),
]
