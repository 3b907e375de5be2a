from django.urls import path

from sessions import views

# /sessions/<id>/... is the proxy's (labportal.asgi), not Django's.
urlpatterns = [
    path("sessions/", views.session_list, name="session_list"),
    path("sessions/new/", views.session_new, name="session_new"),
    path("jobs/<int:pk>/session/", views.session_detail, name="session_detail"),
    path("jobs/<int:pk>/session/status/", views.session_status_view, name="session_status"),
    path("jobs/<int:pk>/terminal/", views.terminal_page, name="terminal_page"),
]
