from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save
from django.utils.translation import gettext_lazy as _


class ClusterConfig(AppConfig):
    name = "cluster"
    verbose_name = _("Machines")

    def ready(self) -> None:
        from cluster.models import NodeToken
        from cluster.signing import node_tokens_changed
        from cluster.tasks import broker_message_dropped
        from protocol.broker import rejections

        # What the control worker drops off the broker is shown to admins like refused reports.
        rejections.connect(broker_message_dropped)

        # Report checks cache the node keys per process (cluster.signing).
        post_save.connect(node_tokens_changed, sender=NodeToken, dispatch_uid="node-keys-save")
        post_delete.connect(node_tokens_changed, sender=NodeToken, dispatch_uid="node-keys-delete")
