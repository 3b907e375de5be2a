from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path
from django.utils.translation import gettext_lazy as _
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from labportal import views as portal_views
from ops import views as ops_views

handler500 = "labportal.error_pages.server_error"

admin.site.site_header = _("LabPortal administration")
admin.site.site_title = _("LabPortal admin")
admin.site.index_title = _("Lab settings, people and machines")

api_urls: list[URLPattern | URLResolver] = [
    path("", include("joblogs.api_urls")),
    path("", include("jobqueue.api_urls")),
    path("", include("reservations.api_urls")),
    path("", include("accounts.api_urls")),
    path("", include("approvals.api_urls")),
    path("", include("reports.api_urls")),
    path("", include("telemetry.api_urls")),
    path("", include("alerts.api_urls")),
    path("", include("files.api_urls")),
    path("", include("sessions.api_urls")),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api_docs"),
]

urlpatterns = [
    path("favicon.ico", portal_views.favicon),
    path("", portal_views.dashboard, name="dashboard"),
    path("", include("cluster.urls")),
    path("healthz", ops_views.healthz, name="healthz"),
    path("metrics", ops_views.metrics, name="metrics"),
    path("i18n/setlang/", portal_views.set_language, name="set_language"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("accounts/", include("allauth.urls")),
    path("account/", include("accounts.urls")),
    path("jobs/", include("jobqueue.urls")),
    path("jobs/", include("approvals.urls")),
    path("", include("sessions.urls")),
    path("reservations/", include("reservations.urls")),
    path("telemetry/", include("telemetry.urls")),
    path("reports/", include("reports.urls")),
    path("", include("handbook.urls")),
    path("alerts/", include("alerts.urls")),
    path("files/", include("files.urls")),
    # One sign-in page for everyone, so that the login lockout covers staff too.
    path("admin/login/", portal_views.admin_login, name="admin_login"),
    path("admin/", admin.site.urls),
    # The API, version 1 (docs/api.md). /api/ without a version is its deprecated alias
    # (core/api_versioning.py); the versioned paths come last, so that reverse() names them.
    path("api/", include(api_urls)),
    path("api/v1/", include(api_urls)),
]
