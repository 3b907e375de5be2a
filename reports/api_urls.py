from django.urls import path
from rest_framework.routers import SimpleRouter

from reports.api import ReportTaskViewSet, UsageReportView

router = SimpleRouter()
router.register("reports/tasks", ReportTaskViewSet, basename="report-task")

urlpatterns = [
    path("reports/usage/", UsageReportView.as_view(), name="api_usage_report"),
    *router.urls,
]
