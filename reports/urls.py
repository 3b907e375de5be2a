from django.urls import path

from reports import views

urlpatterns = [
    path("", views.report_page, name="report_page"),
    path("forecast/", views.report_forecast, name="report_forecast"),
    path("csv/<slug:slug>.csv", views.report_csv, name="report_csv"),
    path("charts/<slug:name>.png", views.report_chart, name="report_chart"),
    path("tasks/", views.report_task_new, name="report_task_new"),
    path("tasks/<int:pk>/", views.report_task, name="report_task"),
    path("tasks/<int:pk>/report.pdf", views.report_task_pdf, name="report_task_pdf"),
    path(
        "tasks/<int:pk>/apply/<int:option>/", views.report_policy_apply, name="report_policy_apply"
    ),
]
