"""Approvals API routes, mounted under /api/ by labportal/urls.py."""

from rest_framework.routers import SimpleRouter

from approvals.api import EmergencyViewSet, GrantViewSet

router = SimpleRouter()
router.register("grants", GrantViewSet, basename="grant")
router.register("emergencies", EmergencyViewSet, basename="emergency")

urlpatterns = router.urls
