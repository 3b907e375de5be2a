"""The submit's written-out reads answer as the ORM queries they stand for, on the same rows
(on SQLite in the first pass of .ci/run and on PostgreSQL in the second)."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.db.models import Count, Max, Q
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from accounts.models import Category
from cluster.models import Gpu, Node
from jobqueue import submit_sql
from jobqueue.models import CategoryQueueAllowance, ContainerImage, Job, Queue
from tests.factories import GpuFactory, NodeFactory, UserFactory, default_queue

pytestmark = pytest.mark.django_db


def capacity_by_orm(
    *, shared_slot: bool, min_memory_mb: int, gpu_model: str, unknown_memory_fits: bool
) -> int:
    """The ORM query the written-out capacity replaced, kept here as its definition."""
    units = Gpu.objects.filter(node__state__in=[Node.State.UP, Node.State.DRAINING]).exclude(
        state=Gpu.State.MISSING
    )
    if shared_slot:
        units = units.filter(kind=Gpu.Kind.SLOT)
    else:
        units = units.exclude(kind=Gpu.Kind.SLOT).filter(children__isnull=True)
    if min_memory_mb:
        enough = Q(memory_mb__gte=min_memory_mb)
        units = units.filter(enough | Q(memory_mb=0) if unknown_memory_fits else enough)
    if gpu_model:
        units = units.filter(model__icontains=gpu_model)
    best = units.values("node").annotate(n=Count("id")).aggregate(m=Max("n"))["m"]
    return int(best or 0)


def lab_of_mixed_gpus() -> None:
    """Nodes up, draining and down; GPUs whole, split into MIG instances and shared slots,
    missing and disabled; memory known and unknown; models whose names hold % and _."""
    models = ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "nvidia a100_pcie", "RTX 100% test"]
    memory = [81920, 40960, 0, 24576]
    for place, state in enumerate(
        [Node.State.UP, Node.State.DRAINING, Node.State.DOWN, Node.State.UP]
    ):
        node = NodeFactory.create(name=f"mixed{place}", state=state)
        for i in range(place + 3):
            gpu = GpuFactory.create(
                node=node,
                index=i,
                model=models[(place + i) % 4],
                memory_mb=memory[(place * 2 + i) % 4],
                state=[Gpu.State.AVAILABLE, Gpu.State.MISSING, Gpu.State.DISABLED][i % 3]
                if i
                else Gpu.State.AVAILABLE,
            )
            if i == 1 or (place == 3 and i < 3):
                for k in range(2):  # split: the parent is no longer a whole unit
                    Gpu.objects.create(
                        node=node,
                        index=i,
                        uuid=f"{gpu.uuid}::{k}",
                        model=gpu.model,
                        memory_mb=gpu.memory_mb // 2,
                        kind=Gpu.Kind.SLOT if k == 0 or place == 3 else Gpu.Kind.MIG,
                        parent=gpu,
                    )


def test_the_largest_node_capacity_is_the_orms_for_every_kind_of_request() -> None:
    lab_of_mixed_gpus()
    answers = set()
    for shared, memory_mb, model, unknown in itertools.product(
        [False, True],
        [0, 20000, 40960, 81920, 100000],
        ["", "a100", "A100-SXM4", "H100", "100%", "a100_", "%", "_", "\\", "nothing"],
        [False, True],
    ):
        ask: dict[str, Any] = {
            "shared_slot": shared,
            "min_memory_mb": memory_mb,
            "gpu_model": model,
            "unknown_memory_fits": unknown,
        }
        expected = capacity_by_orm(**ask)
        assert submit_sql.largest_node_capacity(**ask) == expected, ask
        answers.add(expected)
    # The lab tells the requests apart: the comparison is not between zeros.
    assert len(answers) >= 4


def test_the_waiting_jobs_are_the_pending_and_held_ones_of_the_owner(image: Any) -> None:
    owner, other = UserFactory.create(), UserFactory.create()
    queue = default_queue()
    for state, who in itertools.product(Job.State.values, [owner, other]):
        Job.objects.create(
            owner=who, queue=queue, image=image, command=["true"], time_limit_s=60, state=state
        )
    expected = Job.objects.filter(owner=owner).pending().count()
    assert expected == len(Job.WAITING_STATES)
    assert submit_sql.waiting_jobs(owner) == expected


def test_a_queue_and_an_image_are_found_only_while_open(image: Any) -> None:
    queue = default_queue()
    found = submit_sql.open_queue(queue.name)
    assert found == queue and found is not None
    assert (found.priority_factor, found.max_gpus_per_job) == (
        queue.priority_factor,
        queue.max_gpus_per_job,
    )
    assert submit_sql.open_queue("no-such-queue") is None
    Queue.objects.filter(pk=queue.pk).update(is_active=False)
    assert submit_sql.open_queue(queue.name) is None

    assert submit_sql.allowed_image(image.reference) == image
    assert submit_sql.allowed_image(image.reference + "x") is None
    ContainerImage.objects.filter(pk=image.pk).update(enabled=False)
    assert submit_sql.allowed_image(image.reference) is None


def test_the_weekly_allowance_is_the_one_that_sets_a_limit() -> None:
    category = Category.objects.create(name="visitors-sql")
    normal, debug = default_queue(), default_queue("debug")
    CategoryQueueAllowance.objects.create(
        category=category, queue=normal, max_running_jobs_per_user=2
    )
    assert submit_sql.weekly_allowance(category, normal) is None
    limited = CategoryQueueAllowance.objects.create(
        category=category, queue=debug, max_gpu_hours_per_week=30
    )
    found = submit_sql.weekly_allowance(category, debug)
    assert found == limited and found.max_gpu_hours_per_week == 30
    assert submit_sql.weekly_allowance(category, normal) is None


def test_the_finished_runtimes_are_the_owners_latest_completed_runs(image: Any) -> None:
    owner, other = UserFactory.create(), UserFactory.create()
    queue = default_queue()
    now = timezone.now()
    made = []
    for n in range(8):
        ended = now - timedelta(minutes=10 * n)
        made.append(
            Job.objects.create(
                owner=owner,
                queue=queue,
                image=image,
                command=["python", f"run{n}.py"],
                command_shape_key=f"shape-{n % 3}",
                gpus=1 + n % 2,
                time_limit_s=3600 + n,
                state=Job.State.COMPLETED if n != 5 else Job.State.FAILED,
                started_at=ended - timedelta(seconds=100 * n + 0.5),
                ended_at=ended,
            )
        )
    # Another member's run, and a completed job of the owner's that never started.
    for who, started in [(other, now - timedelta(seconds=5)), (owner, None)]:
        Job.objects.create(
            owner=who,
            queue=queue,
            image=image,
            command=["x"],
            time_limit_s=60,
            state=Job.State.COMPLETED,
            started_at=started,
            ended_at=now if started else None,
        )

    got = submit_sql.finished_runtimes(owner.pk, excluding=made[1].pk, limit=5)
    orm = (
        Job.objects.filter(
            owner_id=owner.pk,
            state=Job.State.COMPLETED,
            started_at__isnull=False,
            ended_at__isnull=False,
        )
        .exclude(pk=made[1].pk)
        .order_by("-ended_at")
        .values_list(
            "image__reference",
            "command_shape_key",
            "gpus",
            "started_at",
            "ended_at",
            "time_limit_s",
        )[:5]
    )
    expected = [(i, s, g, (e - b).total_seconds(), t) for i, s, g, b, e, t in orm if e and b]
    assert [row[:3] + row[4:] for row in got] == [row[:3] + row[4:] for row in expected]
    assert [row[3] for row in got] == pytest.approx([row[3] for row in expected], abs=1e-3)
    assert [row[3] for row in got] == pytest.approx([0.5, 200.5, 300.5, 400.5, 600.5], abs=1e-3)
    assert len(submit_sql.finished_runtimes(owner.pk, excluding=None, limit=200)) == 7


@pytest.mark.django_db(transaction=True)
def test_locking_a_member_for_their_limits_needs_a_transaction() -> None:
    member = UserFactory.create()
    with pytest.raises(TransactionManagementError):
        member.lock_for_limits()
    with transaction.atomic():
        member.lock_for_limits()
