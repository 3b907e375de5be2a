"""Fetch the npm packages pinned in package-lock.json into node_modules/, without npm.

The portal image needs only htmx's built files; a whole Node.js toolchain in the
image build for one tarball is not worth it. Each tarball is checked against the
lock file's sha512 integrity before it is unpacked.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import sys
import tarfile
import urllib.request
from pathlib import Path

REGISTRY = "https://registry.npmjs.org"


def fetch(root: Path) -> None:
    lock = json.loads((root / "package-lock.json").read_text())
    for key, meta in lock["packages"].items():
        if not key.startswith("node_modules/"):
            continue
        name = key.removeprefix("node_modules/")
        url = meta.get("resolved") or (
            f"{REGISTRY}/{name}/-/{name.rsplit('/', 1)[-1]}-{meta['version']}.tgz"
        )
        with urllib.request.urlopen(url, timeout=60) as response:
            data = response.read()
        algorithm, _, expected = meta["integrity"].partition("-")
        actual = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
        if actual != expected:
            sys.exit(f"{name}: integrity mismatch for {url} (lock {expected}, got {actual})")
        target = root / key
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():
                # npm tarballs put everything under package/; only plain files are taken,
                # and a path that would leave the target is refused.
                relative = Path(member.name.split("/", 1)[-1])
                if not member.isfile() or relative.is_absolute() or ".." in relative.parts:
                    continue
                source = tar.extractfile(member)
                assert source is not None
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                (target / relative).write_bytes(source.read())
        print(f"{name} {meta['version']} -> {target}")


if __name__ == "__main__":
    fetch(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
