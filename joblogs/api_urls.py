from django.urls import path

from joblogs.api import JobLogDownloadView, JobLogView

urlpatterns = [
    path("jobs/<int:pk>/log/", JobLogView.as_view(), name="job-log"),
    path("jobs/<int:pk>/log/download/", JobLogDownloadView.as_view(), name="job-log-download"),
]
