from rest_framework.routers import SimpleRouter

from jobqueue.api import JobViewSet, QueueViewSet

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("queues", QueueViewSet, basename="queue")

urlpatterns = router.urls
