"""LabPortal's own executor: the scheduling pass over the pure engine, dispatch to the
node agents, the agents' job events, reconciliation with what nodes report, and the
escalation of stops. Nothing below imports it; the job queue reaches it through
``jobqueue.executor.current()`` and the signals of cluster/ and jobqueue/."""
