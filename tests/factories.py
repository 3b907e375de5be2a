from __future__ import annotations

import factory
from factory.django import DjangoModelFactory

from accounts.models import Category, User
from cluster.models import Gpu, Node
from jobqueue.models import ContainerImage, Queue


class CategoryFactory(DjangoModelFactory[Category]):
    class Meta:
        model = Category
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"Category {n}")


class UserFactory(DjangoModelFactory[User]):
    class Meta:
        model = User
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@lab.example")
    password = factory.PostGenerationMethodCall("set_password", "correct-horse-battery")

    @factory.post_generation
    def save_password(obj: User, create: bool, extracted: object, **kwargs: object) -> None:
        if create:
            obj.save()


class NodeFactory(DjangoModelFactory[Node]):
    class Meta:
        model = Node
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"gpu{n:02d}")
    state = Node.State.UP
    address = "10.0.0.1"


class GpuFactory(DjangoModelFactory[Gpu]):
    class Meta:
        model = Gpu

    node = factory.SubFactory(NodeFactory)
    index = factory.Sequence(lambda n: n % 8)
    uuid = factory.Sequence(lambda n: f"GPU-test-{n:08d}")
    model = "NVIDIA A100-SXM4-80GB"
    memory_mb = 81920


def default_queues() -> None:
    """The data migration's queues, made again where a transactional test flushed them."""
    import importlib

    defaults = importlib.import_module("jobqueue.migrations.0003_default_queues").DEFAULT_QUEUES
    for spec in defaults:
        Queue.objects.get_or_create(name=spec["name"], defaults=spec)


def default_queue(name: str = "normal") -> Queue:
    """One of the default queues, whatever tests ran before on this worker."""
    queue = Queue.objects.filter(name=name).first()
    if queue is None:
        default_queues()
        queue = Queue.objects.get(name=name)
    return queue


class ContainerImageFactory(DjangoModelFactory[ContainerImage]):
    class Meta:
        model = "jobqueue.ContainerImage"
        django_get_or_create = ("reference",)

    reference = "labportal/busybox:test"


def make_cluster(
    nodes: int = 2, gpus_per_node: int = 4, model: str = "NVIDIA A100-SXM4-80GB"
) -> list[Node]:
    """Nodes that are up, each with whole GPUs."""
    made = []
    for n in range(nodes):
        node = NodeFactory.create(name=f"gpu{n + 1:02d}", state=Node.State.UP)
        for i in range(gpus_per_node):
            GpuFactory(node=node, index=i, uuid=f"GPU-{node.name}-{i}", model=model)
        made.append(node)
    return made


def make_slot(parent_uuid: str = "GPU-gpu01-0") -> Gpu:
    """One shared slot (half the memory) on the GPU ``parent_uuid``."""
    parent = Gpu.objects.get(uuid=parent_uuid)
    return Gpu.objects.create(
        node=parent.node,
        index=0,
        uuid=f"{parent_uuid}::slot0",
        model=parent.model,
        memory_mb=parent.memory_mb // 2,
        kind=Gpu.Kind.SLOT,
        parent=parent,
    )
