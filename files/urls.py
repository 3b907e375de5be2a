"""The file browser's pages, mounted under /files/ by labportal/urls.py."""

from django.urls import path

from files import views

urlpatterns = [
    path("", views.files_index, name="files_index"),
    path("<str:ref>/", views.files_browse, name="files_browse"),
    path("<str:ref>/download/", views.files_download, name="files_download"),
    path("<str:ref>/upload/", views.files_upload, name="files_upload"),
    path("<str:ref>/mkdir/", views.files_mkdir, name="files_mkdir"),
    path("<str:ref>/delete/", views.files_delete, name="files_delete"),
]
