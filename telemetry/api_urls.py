from rest_framework.routers import SimpleRouter

from telemetry.api import TelemetryViewSet

router = SimpleRouter()
router.register("telemetry", TelemetryViewSet, basename="telemetry")

urlpatterns = router.urls
