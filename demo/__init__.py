"""The demo lab: ``manage.py seed_demo``, ``seed_demo_history`` and ``rundemo`` (``make demo``).

Not part of the installed product: the wheel leaves this package out, and settings add
the app only when it is present (a checkout).
"""
