"""Drive the containerised portal over HTTP like a browser would: log in as the admin
through the login form, submit a job through the API with the session (CSRF included),
and wait until an agent has run it. Standard library only; run by .ci/container-e2e.sh.

usage: container_e2e_http.py BASE_URL USERNAME PASSWORD IMAGE
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class Browser:
    def __init__(self, base: str) -> None:
        self.base = base.rstrip("/")
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    def csrf(self) -> str:
        return next(c.value for c in self.cookies if c.name == "csrftoken")

    def request(
        self, method: str, path: str, data: bytes | None = None, **headers: str
    ) -> tuple[int, str]:
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with self.opener.open(req, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        status, text = self.request(
            method,
            path,
            data,
            **{
                "Content-Type": "application/json",
                "X-CSRFToken": self.csrf(),
                "Referer": self.base + "/",
            },
        )
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text


def fail(message: str) -> None:
    sys.exit(f"container e2e: {message}")


def main(base: str, username: str, password: str, image: str) -> None:
    browser = Browser(base)
    status, page = browser.request("GET", "/accounts/login/")
    if status != 200:
        fail(f"GET /accounts/login/ answered {status}")
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    if not match:
        fail("the login page has no CSRF token")
    form = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": match.group(1), "login": username, "password": password}
    ).encode()
    status, page = browser.request(
        "POST",
        "/accounts/login/",
        form,
        Referer=base + "/accounts/login/",
        **{"Content-Type": "application/x-www-form-urlencoded"},
    )
    if status != 200 or not any(c.name == "sessionid" for c in browser.cookies):
        fail(f"logging in as {username} failed (HTTP {status}):\n{page[-1500:]}")
    print(f"logged in over HTTP as {username}")

    status, static = browser.request("GET", "/static/vendor/htmx/htmx.min.js")
    if status != 200 or "htmx" not in static[:2000]:
        fail(f"collected static files are not served (HTTP {status})")

    status, job = browser.api(
        "POST",
        "/api/jobs/",
        {
            "image": image,
            "queue": "debug",
            "gpus": 1,
            "time_limit_s": 300,
            "cpus": "0.5",
            "memory_mb": 128,
            "command": [
                "sh",
                "-c",
                "echo hello-from-the-container-e2e gpus=$NVIDIA_VISIBLE_DEVICES",
            ],
        },
    )
    if status != 201:
        fail(f"submitting a job answered {status}: {job}")
    print(f"submitted job {job['id']}")

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        status, job = browser.api("GET", f"/api/jobs/{job['id']}/")
        if job.get("state") in ("completed", "failed", "cancelled", "timed_out", "lost"):
            break
        time.sleep(2)
    else:
        fail(f"job {job['id']} did not finish within 180 s; last state {job.get('state')}")
    if job["state"] != "completed" or job["exit_code"] != 0:
        fail(
            f"job {job['id']} ended {job['state']} ({job.get('end_reason')}, exit {job.get('exit_code')})"
        )
    status, logs = browser.api("GET", f"/api/jobs/{job['id']}/logs/")
    if "hello-from-the-container-e2e" not in json.dumps(logs):
        fail(f"the job's log does not show its output: {logs}")
    print(
        f"job {job['id']} completed on node {job['node']} (GPUs {job['gpu_uuids']}); its log shows its output"
    )


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
