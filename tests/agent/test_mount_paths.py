"""Mount sources walked below their allowed root without following symlinks (issue 25)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.runtime import MountSpec
from agent.runtime.mount_paths import MountRefused, checked_source, sources_changed_since_checked


def mount(root: Path, source: Path) -> MountSpec:
    return MountSpec(source=str(source), target="/data", root=str(root), read_only=False)


@pytest.fixture
def srv(tmp_path: Path) -> Path:
    for member in ("alice/scratch", "bob"):
        (tmp_path / "srv" / member).mkdir(parents=True)
    return tmp_path / "srv"


def test_a_real_directory_is_handed_over_by_its_path_below_the_roots_real_path(
    tmp_path: Path, srv: Path
) -> None:
    (tmp_path / "lab").symlink_to(srv)  # the operator's root may itself be a link

    checked = checked_source(mount(tmp_path / "lab", tmp_path / "lab" / "alice" / "scratch"))

    assert checked.real_path == str(srv.resolve() / "alice" / "scratch")


@pytest.mark.parametrize(
    ("link", "source"),
    [
        ("alice/scratch", "alice/scratch"),  # the source itself
        ("alice/scratch", "alice/scratch/run1"),  # a directory on the way to it
    ],
)
def test_a_symlink_below_the_root_is_refused_and_named_with_its_target(
    srv: Path, link: str, source: str
) -> None:
    (srv / link).rmdir()
    (srv / link).symlink_to(srv / "bob")

    with pytest.raises(MountRefused) as refused:
        checked_source(mount(srv, srv / source))

    assert f"{srv / link} is a symlink (to {srv / 'bob'})" in str(refused.value)


def test_a_symlink_to_a_directory_outside_the_root_is_refused_too(srv: Path) -> None:
    (srv / "alice" / "scratch").rmdir()
    (srv / "alice" / "scratch").symlink_to("/")

    with pytest.raises(MountRefused, match=r"scratch is a symlink \(to /\)"):
        checked_source(mount(srv, srv / "alice" / "scratch"))


def test_a_missing_source_is_refused_saying_which_directory_is_missing(srv: Path) -> None:
    with pytest.raises(MountRefused, match=r"carol cannot be opened \(No such file"):
        checked_source(mount(srv, srv / "carol" / "data"))


def test_a_source_replaced_after_its_check_is_reported_changed(srv: Path) -> None:
    scratch, other = srv / "alice" / "scratch", srv / "alice" / "other"
    checked = [checked_source(mount(srv, scratch))]
    assert sources_changed_since_checked(checked) == []

    scratch.rename(other)
    scratch.mkdir()  # a directory again, but not the one that was checked
    assert sources_changed_since_checked(checked) == [
        f"{scratch} is no longer the directory that was checked"
    ]

    scratch.rmdir()
    scratch.symlink_to(srv / "bob")
    (changed,) = sources_changed_since_checked(checked)
    assert "is a symlink" in changed
