"""LabPortal's kernel: errors, stored texts, durations, tokens and API helpers.

It is no Django app (no models with tables, no migrations) and imports no app of the
portal; every app may import it.
"""
