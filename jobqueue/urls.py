from django.urls import path

from jobqueue import views

urlpatterns = [
    path("", views.job_list, name="job_list"),
    path("submit/", views.job_submit, name="job_submit"),
    path("queue/", views.queue_overview, name="queue_overview"),
    path("<int:pk>/", views.job_detail, name="job_detail"),
    path("<int:pk>/again/", views.job_submit_again, name="job_submit_again"),
    path("templates/<int:pk>/delete/", views.job_template_delete, name="job_template_delete"),
    path("<int:pk>/cancel/", views.job_cancel, name="job_cancel"),
    path("<int:pk>/logs/", views.job_refresh_logs, name="job_refresh_logs"),
]
