"""LabPortal's scheduling engine: pure Python, no Django, database or Celery import.

``plan(state, policy, now) -> Plan`` is the one entry point; see docs/scheduler.md.
"""

from scheduler.engine import plan
from scheduler.fairshare import UsageRecord, decayed_usage, fairshare_factors
from scheduler.model import (
    CategoryPolicy,
    ClusterState,
    Gpu,
    GpuKind,
    Guarantee,
    Node,
    NodeState,
    PendingInfo,
    PendingJob,
    Plan,
    Policy,
    Preemption,
    QueuePolicy,
    Reason,
    Reservation,
    RunningJob,
    ShareNode,
    Start,
)
from scheduler.predict import JobFeatures, RuntimePredictor, command_shape

__all__ = [
    "CategoryPolicy",
    "ClusterState",
    "Gpu",
    "GpuKind",
    "Guarantee",
    "JobFeatures",
    "Node",
    "NodeState",
    "PendingInfo",
    "PendingJob",
    "Plan",
    "Policy",
    "Preemption",
    "QueuePolicy",
    "Reason",
    "Reservation",
    "RunningJob",
    "RuntimePredictor",
    "ShareNode",
    "Start",
    "UsageRecord",
    "command_shape",
    "decayed_usage",
    "fairshare_factors",
    "plan",
]
