from django.urls import path

from handbook import views

urlpatterns = [
    path("help/", views.help_index, name="help_index"),
    path("help/tutorial/", views.tutorial, name="tutorial"),
    path("help/<slug:slug>/", views.help_page, name="help_page"),
    path("rules/", views.rules, name="rules"),
    path("help/first-steps/dismiss/", views.onboarding_dismiss, name="onboarding_dismiss"),
]
