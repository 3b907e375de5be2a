from __future__ import annotations

import factory
from factory.django import DjangoModelFactory

from accounts.models import Category, User
from cluster.models import Gpu, Node


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
    def save_password(obj: User, create: bool, extracted: object, **kwargs: object) -> None:  # noqa: N805
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
