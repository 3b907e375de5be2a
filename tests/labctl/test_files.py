"""labctl files ls and labctl cp, both ways, against the live test portal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobqueue.models import VolumeMount
from tests.labctl.conftest import Run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def home(tmp_path: Path, settings: Any) -> Path:
    root = tmp_path / "shared"
    (root / "alice" / "proj").mkdir(parents=True)
    settings.LABPORTAL_FILES_ROOTS = [str(root)]
    settings.LABPORTAL_FILE_UPLOAD_MAX_MB = 1
    VolumeMount.objects.create(
        name="home", source_template=f"{root}/{{username}}", target="/home", read_only=False
    )
    return root / "alice"


def test_a_file_goes_up_and_comes_back_the_same(
    labctl: Run, as_alice: str, home: Path, tmp_path: Path
) -> None:
    local = tmp_path / "train.py"
    local.write_bytes(b"print('hello')\n" * 1000)
    up = labctl("cp", local, "volume:home/proj/")
    assert up.code == 0, up.err
    assert (home / "proj" / "train.py").read_bytes() == local.read_bytes()
    listed = labctl("files", "ls", "volume:home/proj")
    assert listed.code == 0 and "train.py" in listed.out
    back = tmp_path / "back"
    back.mkdir()
    down = labctl("cp", "volume:home/proj/train.py", back)
    assert down.code == 0, down.err
    assert (back / "train.py").read_bytes() == local.read_bytes()
    assert "volume:home" in labctl("files", "ls").out


def test_cp_says_clearly_what_is_wrong(
    labctl: Run, as_alice: str, home: Path, tmp_path: Path
) -> None:
    local = tmp_path / "f.txt"
    local.write_text("x")
    assert labctl("cp", local, "volume:home/").code == 0
    again = labctl("cp", local, "volume:home/")
    assert again.code == 1 and "already exists" in again.err
    assert labctl("cp", "--overwrite", local, "volume:home/").code == 0
    escape = labctl("cp", "volume:home/../bob/x", tmp_path)
    assert escape.code == 1 and "“..” is refused" in escape.err
    missing = labctl("cp", "volume:home/nope.txt", tmp_path)
    assert missing.code == 1 and "does not exist" in missing.err
    assert labctl("cp", local, tmp_path / "other").code == 2
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (3 * 1024 * 1024))
    too_big = labctl("cp", big, "volume:home/")
    assert too_big.code == 1 and "at most 1.0 MiB" in too_big.err
    assert not (home / "big.bin").exists()
