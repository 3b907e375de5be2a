"""The project's URLs with the cluster app's own included (until labportal/urls.py includes them)."""

from django.urls import include, path

from labportal.urls import urlpatterns as project_urlpatterns

urlpatterns = [path("", include("cluster.urls")), *project_urlpatterns]
