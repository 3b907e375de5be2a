"""Approvals (layer 4): members' priority grants and emergency requests, the staff's
decisions (pages, API, admin actions) and their expiry. The requests' models are still
the job queue's (jobqueue/models.py): moving their tables is a separate step."""
