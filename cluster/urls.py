from __future__ import annotations

from django.urls import path

from cluster import views

urlpatterns = [
    path("gpus/", views.gpu_live, name="gpu_live"),
    path("gpus/table/", views.gpu_table, name="gpu_table"),
    path("nodes/<slug:name>/drain/", views.node_drain, name="node_drain"),
]
