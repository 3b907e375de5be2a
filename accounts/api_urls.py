from rest_framework.routers import SimpleRouter

from accounts.api import CreditViewSet, LedgerEntryViewSet, NotificationViewSet

router = SimpleRouter()
router.register("credits", CreditViewSet, basename="credits")
router.register("ledger", LedgerEntryViewSet, basename="ledger-entry")
router.register("notifications", NotificationViewSet, basename="notification")

urlpatterns = router.urls
