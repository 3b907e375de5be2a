"""In a real browser: alice uploads a file into her volume, sees it listed, downloads it back."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from jobqueue.models import VolumeMount
from tests.browser.conftest import log_in
from tests.conftest import PASSWORD

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SHOTS = Path(os.environ.get("LABPORTAL_SHOTS", "/work/shots/files"))


def test_alice_browses_uploads_and_downloads_in_her_volume(
    page: Any, live_server: Any, alice: Any, tmp_path: Path, settings: Any
) -> None:
    root = tmp_path / "shared"
    (root / "alice" / "proj").mkdir(parents=True)
    (root / "alice" / "readme.txt").write_text("hello")
    settings.LABPORTAL_FILES_ROOTS = [str(root)]
    VolumeMount.objects.create(
        name="home", source_template=f"{root}/{{username}}", target="/home", read_only=False
    )
    VolumeMount.objects.create(
        name="scratch", source_template="/nowhere/{username}", target="/s", read_only=False
    )
    log_in(page, live_server, "alice", PASSWORD)
    page.wait_for_selector("[data-testid=username]")
    page.click("[data-testid=nav-files]")
    page.wait_for_selector("[data-testid=files-volumes]")
    assert page.locator("[data-testid=not-reachable]").count() == 1
    page.click("a[href='/files/volume:home/']")
    page.click("[data-testid=folder-link]")
    local = tmp_path / "train.py"
    local.write_text("print('hi')\n")
    page.set_input_files("[data-testid=upload-input]", str(local))
    page.click("[data-testid=upload-button]")
    page.wait_for_selector("text=Uploaded “proj/train.py”.")
    assert (root / "alice" / "proj" / "train.py").read_text() == "print('hi')\n"
    with page.expect_download() as info:
        page.click("[data-testid=download-link]")
    saved = tmp_path / "downloaded.py"
    info.value.save_as(saved)
    assert saved.read_text() == "print('hi')\n"
    assert "proj" in page.locator("[data-testid=breadcrumbs]").inner_text()
    SHOTS.mkdir(parents=True, exist_ok=True)
    for width in (1366, 390):
        page.set_viewport_size({"width": width, "height": 800})
        page.screenshot(path=str(SHOTS / f"folder-en-{width}.png"), full_page=True)
        page.goto(f"{live_server.url}/files/")
        page.screenshot(path=str(SHOTS / f"index-en-{width}.png"), full_page=True)
        page.go_back()
