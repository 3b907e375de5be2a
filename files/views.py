"""The file browser's pages: places, a folder's listing, download, upload, new folder, delete."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from functools import wraps
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from accounts.auth import request_user
from core.errors import DomainError
from core.request_body import takes_bodies_up_to
from files import paths, services
from files.errors import FileNotFound
from files.places import Place, job_dir_root, place_for, volume_places_for
from jobqueue.models import Job

# A multipart body carries a little more than the file: its boundaries and fields.
MULTIPART_OVERHEAD = 1024 * 1024


def upload_body_limit() -> int:
    return services.upload_limit_bytes() + MULTIPART_OVERHEAD


def upload_too_large(size: int) -> str:
    return paths.too_large_message(size, services.upload_limit_bytes())


class FolderForm(forms.Form):
    name = forms.CharField(label=gettext_lazy("New folder"), max_length=255)


def _folder_url(ref: str, folder: str) -> str:
    url = reverse("files_browse", args=[ref])
    return f"{url}?{urlencode({'path': folder})}" if folder else url


def _crumbs(ref: str, parts: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(part, _folder_url(ref, "/".join(parts[: i + 1]))) for i, part in enumerate(parts)]


def _refused(request: HttpRequest, error: DomainError) -> HttpResponse:
    return render(
        request,
        "files/refused.html",
        {"detail": error.message, "status": error.status_code},
        status=error.status_code,
    )


def _in_place(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Resolve the place for the member; a domain error becomes its 4xx page."""

    @wraps(view)
    def wrapped(request: HttpRequest, ref: str) -> HttpResponseBase:
        try:
            return view(request, place_for(request.user, ref))
        except DomainError as error:
            return _refused(request, error)

    return wrapped


@login_required
def files_index(request: HttpRequest) -> HttpResponse:
    jobs = Job.objects.filter(owner=request_user(request)).exclude(started_at=None)
    return render(
        request,
        "files/index.html",
        {
            "volumes": volume_places_for(request.user),
            "job_dirs_on": bool(job_dir_root()),
            "jobs": [(job, f"job:{job.pk}") for job in jobs.order_by("-pk")[:20]],
        },
    )


@login_required
@_in_place
def files_browse(request: HttpRequest, place: Place) -> HttpResponse:
    folder = request.GET.get("path", "")
    parts = paths.clean_parts(folder)
    try:
        listing = paths.list_folder(place.root, place.inner, parts)
    except FileNotFound as error:
        if parts or place.kind != "job":
            raise
        # A job that has not started yet, or ran before job folders were set up.
        return render(request, "files/browse.html", _browse_context(place, parts, None, error))
    return render(request, "files/browse.html", _browse_context(place, parts, listing, None))


def _browse_context(
    place: Place, parts: tuple[str, ...], listing: paths.Listing | None, missing: Any
) -> dict[str, Any]:
    folder = "/".join(parts)
    entries = []
    for entry in listing.entries if listing else []:
        path = "/".join((*parts, entry.name))
        entries.append(
            {
                "entry": entry,
                "path": path,
                "size": paths.human_size(entry.size) if entry.size is not None else "",
                "modified": datetime.fromtimestamp(entry.modified, tz=UTC),
                "folder_url": _folder_url(place.ref, path) if entry.kind == "folder" else "",
            }
        )
    return {
        "place": place,
        "folder": folder,
        "crumbs": _crumbs(place.ref, parts),
        "top_url": _folder_url(place.ref, ""),
        "entries": entries,
        "truncated": bool(listing and listing.truncated),
        "missing": missing.message if missing else "",
        "folder_form": FolderForm(),
        "upload_max": paths.human_size(services.upload_limit_bytes()),
        "upload_max_bytes": services.upload_limit_bytes(),
        "too_large": _(
            "This file is larger than uploads through the portal take (at most %(max)s). Copy "
            "larger files with the lab's shared storage tools, or split the file."
        )
        % {"max": paths.human_size(services.upload_limit_bytes())},
    }


@login_required
@_in_place
def files_download(request: HttpRequest, place: Place) -> HttpResponseBase:
    parts = paths.clean_parts(request.GET.get("path", ""))
    handle, size = paths.open_file(place.root, place.inner, parts)
    # FileResponse streams the open file in blocks and closes it: any size is fine.
    response = FileResponse(handle, as_attachment=True, filename=parts[-1])
    response["Content-Length"] = str(size)
    return response


@takes_bodies_up_to(upload_body_limit, upload_too_large)
@login_required
@require_POST
@_in_place
def files_upload(request: HttpRequest, place: Place) -> HttpResponse:
    folder = request.POST.get("path", "")
    uploaded = request.FILES.get("file")
    if uploaded is None:
        messages.error(request, _("Choose a file to upload."))
        return redirect(_folder_url(place.ref, folder))
    written = services.file_upload(
        place=place,
        folder=folder,
        name=uploaded.name or "",
        size=uploaded.size or 0,
        chunks=uploaded.chunks(),
        overwrite=request.POST.get("overwrite") == "on",
    )
    messages.success(request, _("Uploaded “%(path)s”.") % {"path": written})
    return redirect(_folder_url(place.ref, folder))


@login_required
@require_POST
@_in_place
def files_mkdir(request: HttpRequest, place: Place) -> HttpResponse:
    folder = request.POST.get("path", "")
    form = FolderForm(request.POST)
    if not form.is_valid():
        messages.error(request, _("Give the new folder a name."))
        return redirect(_folder_url(place.ref, folder))
    made = services.folder_create(place=place, folder=folder, name=form.cleaned_data["name"])
    messages.success(request, _("Created the folder “%(path)s”.") % {"path": made})
    return redirect(_folder_url(place.ref, folder))


@login_required
@_in_place
def files_delete(request: HttpRequest, place: Place) -> HttpResponse:
    """GET asks to confirm; POST deletes."""
    path = request.POST.get("path", "") if request.method == "POST" else request.GET.get("path", "")
    parts = paths.clean_parts(path)
    parent = "/".join(parts[:-1])
    if request.method != "POST":
        services.check_writable(place)
        return render(
            request,
            "files/delete.html",
            {
                "place": place,
                "path": "/".join(parts),
                "cancel_url": _folder_url(place.ref, parent),
            },
        )
    kind = services.file_delete(place=place, path=path)
    if kind == "folder":
        messages.success(request, _("Deleted the folder “%(path)s”.") % {"path": "/".join(parts)})
    else:
        messages.success(request, _("Deleted “%(path)s”.") % {"path": "/".join(parts)})
    return redirect(_folder_url(place.ref, parent))
