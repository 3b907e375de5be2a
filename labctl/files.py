"""`labctl files ls` and `labctl cp`: files in your volumes (volume:NAME/...) and job folders (job:ID/...)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from labctl.client import Client
from labctl.errors import UsageError
from labctl.output import dump_json, table, when

CHUNK = 1024 * 1024


def split_remote(text: str) -> tuple[str, str] | None:
    """``job:123/out.txt`` → ("job:123", "out.txt"); None for a local path."""
    for kind in ("volume:", "job:"):
        if text.startswith(kind):
            place, _sep, path = text.partition("/")
            if place == kind:
                raise UsageError(
                    f"{text!r} names no {kind[:-1]}: e.g. volume:home/proj or job:123/"
                )
            return place, path
    return None


def cmd_files_ls(client: Client, target: str | None, as_json: bool) -> int:
    if not target:
        body = client.get("/api/v1/files/")
        if as_json:
            dump_json(body)
            return 0
        rows = [
            [v["place"], v["host_path"], "rw" if v["writable"] else "ro", v["why_not_reachable"]]
            for v in body["volumes"]
        ]
        print(table(["PLACE", "HOST PATH", "ACCESS", "NOTE"], rows))
        if body["job_dirs"]:
            print("Job folders: job:<id>/ (e.g. labctl files ls job:123)")
        else:
            print("Jobs have no folders in this lab (LABPORTAL_JOB_DIR_ROOT is not set).")
        return 0
    remote = split_remote(target)
    if remote is None:
        raise UsageError(f"{target!r} is not a place: use volume:NAME[/PATH] or job:ID[/PATH]")
    body = client.request(
        "GET", "/api/v1/files/list/", params={"place": remote[0], "path": remote[1]}
    )
    if as_json:
        dump_json(body)
        return 0
    rows = [
        [
            e["name"] + ("/" if e["kind"] == "folder" else ""),
            "" if e["size"] is None else str(e["size"]),
            when(e["modified"]),
            e["kind"],
        ]
        for e in body["entries"]
    ]
    print(table(["NAME", "SIZE", "MODIFIED", "KIND"], rows) if rows else "(empty folder)")
    return 0


def cmd_cp(client: Client, source: str, destination: str, overwrite: bool) -> int:
    src, dst = split_remote(source), split_remote(destination)
    if (src is None) == (dst is None):
        raise UsageError(
            "labctl cp copies between this machine and the portal: one of SOURCE and DEST "
            "must be volume:NAME/PATH or job:ID/PATH, the other a local path"
        )
    if src is not None:
        return _download(client, src, Path(destination))
    assert dst is not None
    return _upload(client, Path(source), dst, overwrite)


def _download(client: Client, remote: tuple[str, str], local: Path) -> int:
    place, path = remote
    if not path or path.endswith("/"):
        raise UsageError(f"{place}/{path} is a folder; name a file to copy, e.g. {place}/out.txt")
    target = local / path.rsplit("/", 1)[-1] if local.is_dir() else local
    response = client.send(
        "GET", "/api/v1/files/download/", params={"place": place, "path": path}, stream=True
    )
    partial = target.with_name(f".{target.name}.labctl-part")
    try:
        with open(partial, "wb") as out:
            for chunk in response.iter_content(CHUNK):
                out.write(chunk)
        os.replace(partial, target)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UsageError(f"cannot write {target}: {exc.strerror}") from None
    print(f"{place}/{path} → {target}", file=sys.stderr)
    return 0


def _upload(client: Client, local: Path, remote: tuple[str, str], overwrite: bool) -> int:
    place, path = remote
    if not local.is_file():
        raise UsageError(f"{local} is not a file here")
    # DEST ending in / (or the top) is a folder; else its last part is the new name.
    folder, _sep, name = path.rpartition("/") if not path.endswith("/") and path else (path, "", "")
    name = name or local.name
    with open(local, "rb") as handle:
        body: Any = client.send(
            "POST",
            "/api/v1/files/upload/",
            data={"place": place, "path": folder.rstrip("/"), "overwrite": str(overwrite).lower()},
            files={"file": (name, handle)},
        ).json()
    print(f"{local} → {body['place']}/{body['path']}", file=sys.stderr)
    return 0
