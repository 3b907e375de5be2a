from django.urls import path

from reservations import views

urlpatterns = [
    path("", views.reservation_calendar, name="reservation_calendar"),
    path("mine/", views.reservation_list, name="reservation_list"),
    path("book/", views.reservation_book, name="reservation_book"),
    path("suggest/", views.reservation_suggest_view, name="reservation_suggest"),
    path("<int:pk>/cancel/", views.reservation_cancel_view, name="reservation_cancel"),
    path("<int:pk>/release/", views.reservation_release_view, name="reservation_release"),
    path("<int:pk>/extend/", views.reservation_extend_view, name="reservation_extend"),
    path("feed/reset/", views.calendar_feed_reset, name="reservation_feed_reset"),
    path("ical/<str:token>.ics", views.reservation_ical, name="reservation_ical"),
]
