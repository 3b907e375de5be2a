"""The places a member may browse: their own volumes, and the working folders of their jobs.

A place is named as ``labctl`` and the API name it: ``volume:<name>`` (the member's own
expansion of the volume's host path, ``{username}`` filled in) or ``job:<id>`` (the job's
folder ``<LABPORTAL_JOB_DIR_ROOT>/<owner>/<id>``). The portal reaches them on the lab's
shared storage, mounted on its host at the same paths as on the GPU nodes; only host
paths under ``LABPORTAL_FILES_ROOTS`` are reachable from the portal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from django.conf import settings
from django.utils.translation import gettext as _

from files.errors import FileNotFound, PathRefused, PlaceUnreachable
from jobqueue.models import Job, VolumeMount
from jobqueue.selectors import jobs_visible_to


@dataclass(frozen=True)
class Place:
    ref: str  # "volume:home", "job:12"
    kind: str  # "volume" or "job"
    label: str
    host_path: str
    writable: bool
    # The operator's root the walk starts at, and the components from it to the place.
    root: str = ""
    inner: tuple[str, ...] = ()
    # Empty when reachable; else why the portal cannot open it.
    unreachable: str = ""
    job: Job | None = None

    @property
    def reachable(self) -> bool:
        return not self.unreachable


def files_roots() -> list[str]:
    return [str(PurePosixPath(r)) for r in settings.LABPORTAL_FILES_ROOTS]


def job_dir_root() -> str:
    return str(settings.LABPORTAL_JOB_DIR_ROOT or "")


def job_directory(*, username: str, job_id: int) -> str:
    """The job's working folder on the shared storage; "" when job folders are off."""
    root = job_dir_root()
    if not root:
        return ""
    return str(PurePosixPath(root) / username / str(job_id))


def _under_root(host_path: str) -> tuple[str, tuple[str, ...]] | None:
    """The longest of the portal's roots that ``host_path`` lies under, and the way down."""
    path = PurePosixPath(host_path)
    if not path.is_absolute() or ".." in path.parts:
        return None
    best: PurePosixPath | None = None
    for root in map(PurePosixPath, files_roots()):
        if path.parts[: len(root.parts)] == root.parts and (
            best is None or len(root.parts) > len(best.parts)
        ):
            best = root
    if best is None:
        return None
    return str(best), path.parts[len(best.parts) :]


def _volume_place(volume: VolumeMount, user: Any) -> Place:
    ref = f"volume:{volume.name}"
    try:
        host_path = volume.source_for(user.username)
    except ValueError:
        return Place(
            ref=ref,
            kind="volume",
            label=volume.name,
            host_path=volume.source_template,
            writable=False,
            unreachable=_("Your user name cannot be used in this volume's host path."),
        )
    found = _under_root(host_path)
    if found is None:
        return Place(
            ref=ref,
            kind="volume",
            label=volume.name,
            host_path=host_path,
            writable=not volume.read_only,
            unreachable=_(
                "Not reachable from the portal: this host path is not on storage the "
                "portal's host mounts (LABPORTAL_FILES_ROOTS). Reach it from a job instead."
            ),
        )
    root, inner = found
    return Place(
        ref=ref,
        kind="volume",
        label=volume.name,
        host_path=host_path,
        writable=not volume.read_only,
        root=root,
        inner=inner,
    )


def volume_places_for(user: Any) -> list[Place]:
    """Every enabled volume, as the member's own expansion of its host path."""
    return [_volume_place(v, user) for v in VolumeMount.objects.filter(enabled=True)]


def job_place(user: Any, job: Job) -> Place:
    ref = f"job:{job.pk}"
    root = job_dir_root()
    label = _("Job #%(id)s") % {"id": job.pk}
    if not root:
        return Place(
            ref=ref,
            kind="job",
            label=label,
            host_path="",
            writable=False,
            job=job,
            unreachable=_(
                "Job folders are not set up in this lab (LABPORTAL_JOB_DIR_ROOT is not "
                "set): jobs write only to the volumes they mount."
            ),
        )
    return Place(
        ref=ref,
        kind="job",
        label=label,
        host_path=job_directory(username=job.owner.username, job_id=job.pk),
        writable=True,
        root=root,
        inner=(job.owner.username, str(job.pk)),
        job=job,
    )


def place_for(user: Any, ref: str) -> Place:
    """The place ``ref`` names for ``user``; ``FileNotFound`` for a job that is not theirs
    (staff see every job's folder), as the job pages answer."""
    kind, sep, name = ref.partition(":")
    if kind == "volume" and sep and name:
        volume = VolumeMount.objects.filter(enabled=True, name=name).first()
        if volume is None:
            raise FileNotFound(
                _("There is no volume “%(name)s”. `labctl files ls` lists yours.") % {"name": name}
            )
        place = _volume_place(volume, user)
    elif kind == "job" and sep and name.isdigit():
        job = jobs_visible_to(user).filter(pk=int(name)).first()
        if job is None:
            raise FileNotFound(_("There is no job #%(id)s of yours.") % {"id": name})
        place = job_place(user, job)
    else:
        raise PathRefused(
            _("“%(ref)s” names no place: use volume:<name> or job:<id>, e.g. job:123.")
            % {"ref": ref}
        )
    if not place.reachable:
        raise PlaceUnreachable(place.unreachable)
    return place
