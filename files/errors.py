"""The refusals of the file browser, each with the status the pages and the API answer."""

from __future__ import annotations

from core.errors import DomainError


class PathRefused(DomainError):
    """The path is malformed, or leads out of the place (``..``, a symlink, a device)."""

    code = "path_refused"
    status_code = 400


class FileNotFound(DomainError):
    """Nothing there, or a place the member may not see (not revealed as such)."""

    code = "not_found"
    status_code = 404


class ReadOnlyPlace(DomainError):
    code = "read_only"
    status_code = 403


class PlaceUnreachable(DomainError):
    """The volume or the job directories are not on storage the portal host can see."""

    code = "not_reachable"
    status_code = 409


class AlreadyExists(DomainError):
    code = "exists"
    status_code = 409


class UploadTooLarge(DomainError):
    code = "upload_too_large"
    status_code = 413
