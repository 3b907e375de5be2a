"""What the jobs part tells the layers above it (they connect in their AppConfig.ready())."""

from __future__ import annotations

from django.dispatch import Signal

# After each scheduling pass the portal runs; `duration_s` is how long it took.
scheduling_pass_done = Signal()
