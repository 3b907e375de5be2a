"""What a member does to the files of a place: upload, make a folder, delete.

Each checks that the place takes writes (a read-only volume refuses them) and the
upload limit before anything is written; the path rules are those of ``files.paths``.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.utils.translation import gettext as _

from files import paths
from files.errors import ReadOnlyPlace, UploadTooLarge
from files.places import Place


def upload_limit_bytes() -> int:
    return int(settings.LABPORTAL_FILE_UPLOAD_MAX_MB) * 1024 * 1024


def check_writable(place: Place) -> None:
    if not place.writable:
        raise ReadOnlyPlace(
            _(
                "The volume “%(name)s” is read-only: nothing can be uploaded, created or deleted there."
            )
            % {"name": place.label}
        )


def file_upload(
    *,
    place: Place,
    folder: str,
    name: str,
    size: int,
    chunks: Iterable[bytes],
    overwrite: bool = False,
) -> str:
    """Write an uploaded file into ``folder`` of ``place``; return its path in the place."""
    check_writable(place)
    limit = upload_limit_bytes()
    if size > limit:
        raise UploadTooLarge(paths.too_large_message(size, limit))
    parts = paths.clean_parts(folder)
    paths.write_file(
        place.root, place.inner, parts, name, chunks, max_bytes=limit, overwrite=overwrite
    )
    return "/".join((*parts, name))


def folder_create(*, place: Place, folder: str, name: str) -> str:
    check_writable(place)
    parts = paths.clean_parts(folder)
    paths.make_folder(place.root, place.inner, parts, name)
    return "/".join((*parts, name))


def file_delete(*, place: Place, path: str) -> str:
    """Delete a file or an empty folder; return which it was."""
    check_writable(place)
    return paths.remove(place.root, place.inner, paths.clean_parts(path))
