"""The file browser: what it shows and what it refuses, by page and by API."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from jobqueue.models import Job, VolumeMount
from tests.conftest import api_as
from tests.jobqueue.test_submit import submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def storage(tmp_path: Path, settings: Any) -> Path:
    """Shared storage the portal mounts: /data/<user> (writable), /ro (read-only), jobs."""
    root = tmp_path / "shared"
    for sub in ("data/alice", "data/bob", "ro/alice", "jobs"):
        (root / sub).mkdir(parents=True)
    (root / "data/alice/notes.txt").write_text("alice's notes")
    (root / "data/bob/secret.txt").write_text("bob's secret")
    (root / "ro/alice/dataset.csv").write_text("a,b\n1,2\n")
    settings.LABPORTAL_FILES_ROOTS = [str(root / "data"), str(root / "ro")]
    settings.LABPORTAL_JOB_DIR_ROOT = str(root / "jobs")
    settings.LABPORTAL_FILE_UPLOAD_MAX_MB = 1
    VolumeMount.objects.create(
        name="home", source_template=f"{root}/data/{{username}}", target="/home", read_only=False
    )
    VolumeMount.objects.create(
        name="datasets", source_template=f"{root}/ro/{{username}}", target="/ds", read_only=True
    )
    VolumeMount.objects.create(
        name="scratch", source_template="/nowhere/{username}", target="/s", read_only=False
    )
    return root


def web(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def listing(client: Any, place: str, path: str = "") -> Any:
    return client.get("/api/files/list/", {"place": place, "path": path})


def test_a_member_lists_and_downloads_her_own_volume(alice: Any, storage: Path) -> None:
    api = api_as(alice)
    body = listing(api, "volume:home").json()
    assert [e["name"] for e in body["entries"]] == ["notes.txt"]
    answer = api.get("/api/files/download/", {"place": "volume:home", "path": "notes.txt"})
    assert answer.status_code == 200
    assert b"".join(answer.streaming_content) == b"alice's notes"  # type: ignore[attr-defined]
    page = web(alice).get("/files/volume:home/")
    assert page.status_code == 200 and "notes.txt" in page.content.decode()


def test_the_volume_of_bob_is_not_what_alice_sees_under_the_same_name(
    alice: Any, bob: Any, storage: Path
) -> None:
    names = [e["name"] for e in listing(api_as(bob), "volume:home").json()["entries"]]
    assert names == ["secret.txt"]
    assert "secret.txt" not in str(listing(api_as(alice), "volume:home").json())


@pytest.mark.parametrize(
    "path", ["..", "../bob", "a/../../bob", "/etc/passwd", "/", "notes.txt\x00x"]
)
def test_dot_dot_absolute_paths_and_nul_are_refused(alice: Any, storage: Path, path: str) -> None:
    answer = api_as(alice).get("/api/files/download/", {"place": "volume:home", "path": path})
    assert answer.status_code == 400
    page = web(alice).get("/files/volume:home/", {"path": path})
    assert page.status_code == 400


def test_a_symlink_inside_pointing_outside_is_refused(alice: Any, storage: Path) -> None:
    os.symlink(storage / "data/bob/secret.txt", storage / "data/alice/link.txt")
    answer = api_as(alice).get("/api/files/download/", {"place": "volume:home", "path": "link.txt"})
    assert answer.status_code == 400
    assert "symlink" in answer.json()["detail"]
    kinds = {e["name"]: e["kind"] for e in listing(api_as(alice), "volume:home").json()["entries"]}
    assert kinds["link.txt"] == "symlink"


def test_a_symlinked_parent_folder_is_refused(alice: Any, storage: Path) -> None:
    os.symlink(storage / "data/bob", storage / "data/alice/bobs")
    api = api_as(alice)
    for answer in (
        listing(api, "volume:home", "bobs"),
        api.get("/api/files/download/", {"place": "volume:home", "path": "bobs/secret.txt"}),
        api.post(
            "/api/files/upload/",
            {"place": "volume:home", "path": "bobs", "file": SimpleUploadedFile("x.txt", b"x")},
            format="multipart",
        ),
    ):
        assert answer.status_code == 400, answer.content
        assert "symlink" in answer.json()["detail"]
    assert sorted(os.listdir(storage / "data/bob")) == ["secret.txt"]


def test_a_fifo_is_refused_not_opened(alice: Any, storage: Path) -> None:
    os.mkfifo(storage / "data/alice/pipe")
    answer = api_as(alice).get("/api/files/download/", {"place": "volume:home", "path": "pipe"})
    assert answer.status_code == 400
    assert "FIFO" in answer.json()["detail"]


def test_an_upload_lands_in_the_folder_and_a_second_one_needs_overwrite(
    alice: Any, storage: Path
) -> None:
    api = api_as(alice)

    def upload(content: bytes, **extra: Any) -> Any:
        data = {"place": "volume:home", "path": "", "file": SimpleUploadedFile("t.py", content)}
        return api.post("/api/files/upload/", {**data, **extra}, format="multipart")

    assert upload(b"print(1)").status_code == 201
    assert (storage / "data/alice/t.py").read_bytes() == b"print(1)"
    again = upload(b"print(2)")
    assert again.status_code == 409
    assert (storage / "data/alice/t.py").read_bytes() == b"print(1)"
    assert upload(b"print(2)", overwrite="true").status_code == 201
    assert (storage / "data/alice/t.py").read_bytes() == b"print(2)"
    assert sorted(os.listdir(storage / "data/alice")) == ["notes.txt", "t.py"]


def test_an_upload_over_the_limit_gets_a_clear_error_and_writes_nothing(
    alice: Any, storage: Path
) -> None:
    big = SimpleUploadedFile("big.bin", b"x" * (1024 * 1024 + 1))
    answer = api_as(alice).post(
        "/api/files/upload/", {"place": "volume:home", "file": big}, format="multipart"
    )
    assert answer.status_code == 413
    assert "at most 1.0 MiB" in answer.json()["detail"]
    page = web(alice).post(
        "/files/volume:home/upload/",
        {"path": "", "file": SimpleUploadedFile("big.bin", b"x" * (1024 * 1024 + 1))},
    )
    assert page.status_code == 413
    assert "at most 1.0 MiB" in page.content.decode()
    assert sorted(os.listdir(storage / "data/alice")) == ["notes.txt"]


def test_a_body_far_over_the_limit_is_refused_before_it_is_read(alice: Any, storage: Path) -> None:
    answer = web(alice).generic(
        "POST",
        "/api/files/upload/",
        b"",
        content_type="multipart/form-data; boundary=x",
        CONTENT_LENGTH=str(50 * 1024 * 1024),
    )
    assert answer.status_code == 413
    assert "uploads through the portal take at most 1.0 MiB" in answer.json()["detail"]


def test_a_read_only_volume_refuses_uploads_folders_and_deletes(alice: Any, storage: Path) -> None:
    api = api_as(alice)
    upload = api.post(
        "/api/files/upload/",
        {"place": "volume:datasets", "file": SimpleUploadedFile("x.txt", b"x")},
        format="multipart",
    )
    assert upload.status_code == 403 and "read-only" in upload.json()["detail"]
    folder = api.post(
        "/api/files/folders/", {"place": "volume:datasets", "name": "new"}, format="json"
    )
    assert folder.status_code == 403
    delete = api.post(
        "/api/files/delete/", {"place": "volume:datasets", "path": "dataset.csv"}, format="json"
    )
    assert delete.status_code == 403
    assert sorted(os.listdir(storage / "ro/alice")) == ["dataset.csv"]
    assert listing(api, "volume:datasets").status_code == 200


def test_folders_are_made_and_files_deleted_after_confirmation(alice: Any, storage: Path) -> None:
    client = web(alice)
    assert client.post("/files/volume:home/mkdir/", {"path": "", "name": "proj"}).status_code == 302
    assert (storage / "data/alice/proj").is_dir()
    confirm = client.get("/files/volume:home/delete/", {"path": "notes.txt"})
    assert confirm.status_code == 200 and "cannot be undone" in confirm.content.decode()
    assert (storage / "data/alice/notes.txt").exists()
    assert client.post("/files/volume:home/delete/", {"path": "notes.txt"}).status_code == 302
    assert not (storage / "data/alice/notes.txt").exists()


def test_a_volume_the_portal_cannot_see_is_listed_as_not_reachable(
    alice: Any, storage: Path
) -> None:
    places = {p["place"]: p for p in api_as(alice).get("/api/files/").json()["volumes"]}
    assert places["volume:scratch"]["reachable"] is False
    assert "Not reachable from the portal" in places["volume:scratch"]["why_not_reachable"]
    assert places["volume:home"]["reachable"] is True
    assert listing(api_as(alice), "volume:scratch").status_code == 409
    page = web(alice).get("/files/")
    assert page.status_code == 200 and "Not reachable from the portal" in page.content.decode()


def test_job_folders_are_the_owners_and_staffs_and_nobody_elses(
    alice: Any, bob: Any, admin_user: Any, cluster: Any, image: Any, storage: Path
) -> None:
    job = submit(alice)
    folder = storage / "jobs" / "alice" / str(job.pk)
    folder.mkdir(parents=True)
    (folder / "out.txt").write_text("loss 0.1")
    place = f"job:{job.pk}"
    assert [e["name"] for e in listing(api_as(alice), place).json()["entries"]] == ["out.txt"]
    assert listing(api_as(admin_user), place).status_code == 200
    assert listing(api_as(bob), place).status_code == 404
    assert web(bob).get(f"/files/{place}/").status_code == 404
    download = api_as(bob).get("/api/files/download/", {"place": place, "path": "out.txt"})
    assert download.status_code == 404
    page = web(alice).get(f"/jobs/{job.pk}/")
    assert f"/files/{place}/" in page.content.decode()


def test_without_a_job_dir_root_the_file_page_says_jobs_have_no_folders(
    alice: Any, cluster: Any, image: Any, storage: Path, settings: Any
) -> None:
    settings.LABPORTAL_JOB_DIR_ROOT = ""
    job = submit(alice)
    assert "LABPORTAL_JOB_DIR_ROOT is not set" in web(alice).get("/files/").content.decode()
    assert listing(api_as(alice), f"job:{job.pk}").status_code == 409
    from scheduling.dispatch import start_spec

    assert start_spec(job, [])["job_dir"] == ""


def test_the_start_request_names_the_job_folder(
    alice: Any, cluster: Any, image: Any, storage: Path
) -> None:
    from scheduling.dispatch import start_spec

    job = submit(alice)
    assert start_spec(Job.objects.get(pk=job.pk), [])["job_dir"] == str(
        storage / "jobs" / "alice" / str(job.pk)
    )


def test_a_job_that_has_not_started_says_its_folder_comes_at_the_start(
    alice: Any, cluster: Any, image: Any, storage: Path
) -> None:
    job = submit(alice)
    page = web(alice).get(f"/files/job:{job.pk}/")
    assert page.status_code == 200
    assert "it is made when the job starts" in page.content.decode()


def test_the_pages_read_in_chinese(alice: Any, storage: Path) -> None:
    client = web(alice)
    client.cookies["django_language"] = "zh-hans"
    index = client.get("/files/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "你的挂载卷" in index and "门户无法访问" in index
    folder = client.get("/files/volume:home/", HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    assert "上传文件" in folder and "新建文件夹" in folder


def test_a_folder_lists_each_entrys_size_and_modified_time(alice: Any, storage: Path) -> None:
    target = storage / "data" / "alice" / "report.txt"
    target.write_text("twelve bytes")
    os.utime(target, (1_700_000_000, 1_700_000_000))  # 2023-11-14 22:13 UTC
    page = web(alice).get("/files/volume:home/").content.decode()
    row = page[page.index("report.txt") :]
    row = row[: row.index("</tr>")]
    assert "12 B" in row and "2023" in row, row
