"""Charging jobs for their GPU time (layer 4): it listens to the job queue's
``job_ended`` signal and posts to the ledger of accounts/."""
