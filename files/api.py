"""The files API: the member's places, a folder's listing, download, upload, new folder, delete.

A place is ``volume:<name>`` or ``job:<id>``; ``path`` is inside it, without a leading
``/``. The rules are those of the pages (``files.paths``, ``files.services``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.parsers import StrictJSONParser, StrictMultiPartParser
from core.request_body import takes_bodies_up_to
from files import paths, services
from files.places import Place, job_dir_root, place_for, volume_places_for
from files.views import upload_body_limit, upload_too_large

PLACE_HELP = "`volume:<name>` (your own copy of an allowlisted volume) or `job:<id>`."
PATH_HELP = "A path inside the place, e.g. `results/out.txt`; no leading `/`, no `..`."


class PlaceQuerySerializer(serializers.Serializer):
    place = serializers.CharField(max_length=200, help_text=PLACE_HELP)
    path = serializers.CharField(
        max_length=paths.MAX_PATH_CHARS,
        required=False,
        allow_blank=True,
        default="",
        help_text=PATH_HELP,
    )


class FolderCreateSerializer(PlaceQuerySerializer):
    name = serializers.CharField(max_length=255, help_text="The new folder's name.")


class UploadSerializer(PlaceQuerySerializer):
    file = serializers.FileField(help_text="The file; it keeps its own name.")
    overwrite = serializers.BooleanField(
        default=False, help_text="Replace a file of the same name (default: refuse)."
    )


class PlaceSerializer(serializers.Serializer):
    place = serializers.CharField(source="ref")
    kind = serializers.CharField()
    name = serializers.CharField(source="label")
    host_path = serializers.CharField()
    writable = serializers.BooleanField()
    reachable = serializers.BooleanField()
    why_not_reachable = serializers.CharField(
        source="unreachable", help_text="Why the portal cannot reach it; empty if it can."
    )


class PlacesSerializer(serializers.Serializer):
    volumes = PlaceSerializer(many=True)
    job_dirs = serializers.BooleanField(help_text="Whether jobs get a working folder (job:<id>).")
    upload_max_bytes = serializers.IntegerField()


class EntrySerializer(serializers.Serializer):
    name = serializers.CharField()
    path = serializers.CharField()
    kind = serializers.ChoiceField(choices=["folder", "file", "symlink", "other"])
    size = serializers.IntegerField(allow_null=True)
    modified = serializers.DateTimeField()


class ListingSerializer(serializers.Serializer):
    place = serializers.CharField()
    path = serializers.CharField(allow_blank=True)
    writable = serializers.BooleanField()
    entries = EntrySerializer(many=True)
    truncated = serializers.BooleanField()


class WrittenSerializer(serializers.Serializer):
    place = serializers.CharField()
    path = serializers.CharField()
    kind = serializers.CharField()


class FileErrorSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="What was wrong and how to fix it.")
    code = serializers.CharField()


# No such place or file (or another member's job: not revealed); the place is not
# reachable from the portal, or the file exists (upload without overwrite).
ERRORS = {404: FileErrorSerializer, 409: FileErrorSerializer}


def _place(request: Request, data: dict[str, Any]) -> Place:
    return place_for(request.user, data["place"])


class FilePlacesAPI(APIView):
    @extend_schema(responses=PlacesSerializer, summary="Your volumes, and whether jobs get folders")
    def get(self, request: Request) -> Response:
        return Response(
            PlacesSerializer(
                {
                    "volumes": volume_places_for(request.user),
                    "job_dirs": bool(job_dir_root()),
                    "upload_max_bytes": services.upload_limit_bytes(),
                }
            ).data
        )


class FileListAPI(APIView):
    @extend_schema(parameters=[PlaceQuerySerializer], responses={200: ListingSerializer, **ERRORS})
    def get(self, request: Request) -> Response:
        query = PlaceQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        place = _place(request, query.validated_data)
        parts = paths.clean_parts(query.validated_data["path"])
        listing = paths.list_folder(place.root, place.inner, parts)
        entries = [
            {
                "name": e.name,
                "path": "/".join((*parts, e.name)),
                "kind": e.kind,
                "size": e.size,
                "modified": datetime.fromtimestamp(e.modified, tz=UTC),
            }
            for e in listing.entries
        ]
        return Response(
            ListingSerializer(
                {
                    "place": place.ref,
                    "path": "/".join(parts),
                    "writable": place.writable,
                    "entries": entries,
                    "truncated": listing.truncated,
                }
            ).data
        )


class FileDownloadAPI(APIView):
    @extend_schema(
        parameters=[PlaceQuerySerializer],
        responses={
            (200, "application/octet-stream"): OpenApiResponse(
                OpenApiTypes.BINARY, description="The file's bytes, streamed."
            ),
            **ERRORS,
        },
    )
    def get(self, request: Request) -> FileResponse:
        query = PlaceQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        place = _place(request, query.validated_data)
        parts = paths.clean_parts(query.validated_data["path"])
        handle, size = paths.open_file(place.root, place.inner, parts)
        response = FileResponse(handle, as_attachment=True, filename=parts[-1])
        response["Content-Length"] = str(size)
        return response


class FileUploadAPI(APIView):
    parser_classes = [StrictMultiPartParser]

    @extend_schema(
        request={"multipart/form-data": UploadSerializer},
        responses={201: WrittenSerializer, 413: FileErrorSerializer, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        body = UploadSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        place = _place(request, data)
        uploaded = data["file"]
        written = services.file_upload(
            place=place,
            folder=data["path"],
            name=uploaded.name or "",
            size=uploaded.size or 0,
            chunks=uploaded.chunks(),
            overwrite=data["overwrite"],
        )
        return Response({"place": place.ref, "path": written, "kind": "file"}, status=201)


class FolderCreateAPI(APIView):
    parser_classes = [StrictJSONParser]

    @extend_schema(request=FolderCreateSerializer, responses={201: WrittenSerializer, **ERRORS})
    def post(self, request: Request) -> Response:
        body = FolderCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        place = _place(request, data)
        made = services.folder_create(place=place, folder=data["path"], name=data["name"])
        return Response({"place": place.ref, "path": made, "kind": "folder"}, status=201)


class FileDeleteAPI(APIView):
    parser_classes = [StrictJSONParser]

    @extend_schema(request=PlaceQuerySerializer, responses={200: WrittenSerializer, **ERRORS})
    def post(self, request: Request) -> Response:
        body = PlaceQuerySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        place = _place(request, data)
        kind = services.file_delete(place=place, path=data["path"])
        return Response({"place": place.ref, "path": data["path"], "kind": kind})


upload_view = takes_bodies_up_to(upload_body_limit, upload_too_large)(FileUploadAPI.as_view())
