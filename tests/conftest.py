"""Shared fixtures: alice owns things, bob is in her category, charlie is an outsider, admin runs the lab."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connections
from rest_framework.test import APIClient

from tests.factories import CategoryFactory, UserFactory

PASSWORD = "correct-horse-battery"
CHROMIUM = os.environ.get("LABPORTAL_CHROMIUM", "/usr/bin/chromium")


# Tests that share one of this machine's services by a fixed name (the private Slurm's
# ports, Redis's queues, the Docker engine, real worker and agent processes on one broker)
# run one after another on one xdist worker (`-n 2 --dist loadgroup`); the rest spread.
MACHINE_MARKERS = ("slurm", "e2e", "redis", "docker")
MACHINE_FIXTURES = ("local_slurm",)
# What a test needs of the database, so that the PostgreSQL pass can leave out the rest.
DATABASE_FIXTURES = (
    "db",
    "transactional_db",
    "django_db_setup",
    "live_server",
    "django_db_blocker",
)
# LABPORTAL_TEST_PASS=database (pass 2 of .ci/run): only tests that reach the database or
# the broker; the backend-neutral rest ran, unchanged, in pass 1 on the embedded defaults.
DATABASE_PASS_SKIPS_MARKERS = ("browser",)
DATABASE_PASS_SKIPS_DIRS = ("tests/handbook/", "tests/architecture/")


def uses_machine(item: Any) -> bool:
    fixtures = getattr(item, "fixturenames", ())
    return any(m in item.keywords for m in MACHINE_MARKERS) or any(
        f in fixtures for f in MACHINE_FIXTURES
    )


def in_database_pass(item: Any) -> bool:
    """Whether a test says something about the database or broker it runs on."""
    path = item.nodeid.replace("\\", "/")
    if any(path.startswith(d) for d in DATABASE_PASS_SKIPS_DIRS):
        return False
    if any(m in item.keywords for m in DATABASE_PASS_SKIPS_MARKERS):
        return False
    if any(m in item.keywords for m in ("postgres", "redis", "e2e", "slurm")):
        return True
    fixtures = getattr(item, "fixturenames", ())
    return item.get_closest_marker("django_db") is not None or any(
        f in fixtures for f in DATABASE_FIXTURES
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Real-service tests run where their service is; under CI=true they never silently skip."""
    on_postgres = settings.DATABASE_IS_POSTGRES
    if os.environ.get("LABPORTAL_TEST_PASS", "") == "database":
        kept = [item for item in items if in_database_pass(item)]
        left = [item for item in items if not in_database_pass(item)]
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = kept
    for item in items:
        # Before xdist's own hook, which reads the group into the test's id.
        if uses_machine(item):
            item.add_marker(pytest.mark.xdist_group("machine"))
        if "postgres" in item.keywords and not on_postgres:
            item.add_marker(
                pytest.mark.skip(
                    reason="needs DATABASE_URL=postgres://… (runs in the PostgreSQL pass of .ci/run)"
                )
            )


@pytest.fixture
def phd_category(db: Any) -> Any:
    return CategoryFactory(name="PhD, thesis phase", fairshare_weight=30)


@pytest.fixture
def master_category(db: Any) -> Any:
    return CategoryFactory(name="Master", fairshare_weight=10)


@pytest.fixture
def alice(phd_category: Any) -> Any:
    return UserFactory(username="alice", category=phd_category)


@pytest.fixture
def bob(phd_category: Any) -> Any:
    return UserFactory(username="bob", category=phd_category)


@pytest.fixture
def charlie(master_category: Any) -> Any:
    return UserFactory(username="charlie", category=master_category)


@pytest.fixture
def admin_user(db: Any) -> Any:
    return UserFactory(username="admin", is_staff=True, is_superuser=True)


@pytest.fixture
def api() -> APIClient:
    return APIClient()


def api_as(user: Any) -> APIClient:
    """An API client authenticated with a real personal access token of `user`."""
    from accounts.models import PersonalAccessToken

    _token, secret = PersonalAccessToken.issue(user=user, name="tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def run_concurrently(
    workers: list[Callable[[], Any]], *, connect: Callable[[], None] = lambda: None
) -> list[BaseException]:
    """Start every worker at one barrier, each in its own thread with its own database
    connection (made by `connect`, where the default one will not do); returns what they raised."""
    barrier = threading.Barrier(len(workers), timeout=60)
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], Any]) -> None:
        try:
            connect()
            barrier.wait()
            fn()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=wrap, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def require_in_ci(what: str) -> None:
    """Skip with a reason locally; fail under CI=true, where every real service must be present."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} is required in CI but is not available")
    pytest.skip(f"{what} is not available here")


class SentTasks(list):
    """Celery messages the code under test sent, as (task name, args, queue).

    ``kwargs`` holds each message's keyword arguments, in the same order (a
    command's signature travels there as ``auth``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.kwargs: list[dict[str, Any]] = []

    def named(self, name: str) -> list[tuple[str, list[Any], str]]:
        return [t for t in self if t[0] == name]


@pytest.fixture(autouse=True)
def usage_summed_each_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Passes reuse fair-share usage for a minute; tests see every change at once."""
    from scheduling import passes as scheduling

    scheduling.usage_forget()
    monkeypatch.setattr(scheduling, "USAGE_REUSE_S", 0.0)


@pytest.fixture(autouse=True)
def sent_tasks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> SentTasks:
    """Record messages instead of sending them; end-to-end tests use real processes instead."""
    from labportal.celery import app

    # The portal's app is the current one, as in a portal process: collecting the agent's
    # tests imports the agent's own Celery app, which would otherwise become current and
    # take the portal's shared tasks (``task.delay``) past this recorder.
    app.set_current()
    sent = SentTasks()
    if request.node.get_closest_marker("e2e"):
        return sent

    def send_task(
        name: str, args: Any = None, kwargs: Any = None, queue: str | None = None, **options: Any
    ) -> None:
        sent.append((name, list(args or []), queue or ""))
        sent.kwargs.append(dict(kwargs or {}))

    monkeypatch.setattr(app, "send_task", send_task)
    from scheduling.tasks import scheduling_pass_task

    def record_pass(*_a: Any, **_k: Any) -> None:
        sent.append(("control.scheduling_pass", [], "control"))
        sent.kwargs.append({})

    monkeypatch.setattr(scheduling_pass_task, "apply_async", record_pass)
    from accounts.tasks import notification_email_task

    def record_and_send_email(args: Any = None, **_k: Any) -> None:
        # The email has its own task; here a "worker" runs it as soon as it is enqueued.
        sent.append(("control.notification_email", list(args or []), "control"))
        sent.kwargs.append({})
        notification_email_task(*(args or []))

    monkeypatch.setattr(notification_email_task, "apply_async", record_and_send_email)
    return sent


@pytest.fixture
def queues(db: Any) -> Any:
    """The default queues; a transactional test flushes what the data migration made."""
    from jobqueue.models import Queue
    from tests.factories import default_queues

    default_queues()
    return Queue.objects.all()


@pytest.fixture
def cluster(queues: Any) -> Any:
    from tests.factories import make_cluster

    return make_cluster(nodes=2, gpus_per_node=4)


@pytest.fixture
def image(db: Any) -> Any:
    from tests.factories import ContainerImageFactory

    return ContainerImageFactory()


@pytest.fixture(autouse=True)
def isolated_cache(settings: Any) -> None:
    """A fresh in-process cache per test: login lockout counters never leak between tests.

    The node keys a worker keeps in memory (`cluster.signing`) are dropped too.
    """
    import uuid

    from cluster.signing import node_keys_changed

    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": f"test-{uuid.uuid4().hex}",
        }
    }
    node_keys_changed()


@pytest.fixture(autouse=True)
def default_language() -> Iterator[None]:
    """Each test starts and ends in the default language: a request in Chinese activates
    it in the test's thread (LocaleMiddleware never switches back), and messages built
    outside a request afterwards would come out in Chinese."""
    from django.utils import translation

    translation.deactivate()
    yield
    translation.deactivate()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium under Playwright (its own browser download is not used).

    Here, not in tests/browser, so that every test (the end-to-end ones too) shares one:
    Playwright's sync API runs an event loop in this thread and cannot start a second.
    """
    if not shutil.which(CHROMIUM):
        require_in_ci(f"Chromium at {CHROMIUM} (apt-get install chromium)")
    # Playwright's sync API runs an event loop in this thread; the Django ORM calls
    # the tests make around it are still synchronous and safe.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        yield browser
        browser.close()
