from django.urls import path

from alerts import views

urlpatterns = [
    path("", views.alert_list, name="alert_list"),
    path("<int:pk>/acknowledge/", views.alert_acknowledge, name="alert_acknowledge"),
]
