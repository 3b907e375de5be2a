"""Alerts API routes, mounted under /api/ by labportal/urls.py."""

from rest_framework.routers import SimpleRouter

from alerts.api import AlertViewSet

router = SimpleRouter()
router.register("alerts", AlertViewSet, basename="alert")

urlpatterns = router.urls
