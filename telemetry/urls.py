from django.urls import path

from telemetry import views

urlpatterns = [
    path("overview/", views.lab_overview, name="lab_overview"),
]
