"""Files API routes, mounted under /api/ by labportal/urls.py."""

from django.urls import path

from files import api

urlpatterns = [
    path("files/", api.FilePlacesAPI.as_view(), name="api_files_places"),
    path("files/list/", api.FileListAPI.as_view(), name="api_files_list"),
    path("files/download/", api.FileDownloadAPI.as_view(), name="api_files_download"),
    path("files/upload/", api.upload_view, name="api_files_upload"),
    path("files/folders/", api.FolderCreateAPI.as_view(), name="api_files_folder"),
    path("files/delete/", api.FileDeleteAPI.as_view(), name="api_files_delete"),
]
