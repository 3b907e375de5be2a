"""The wire between the portal and the node agents: broker transports that refuse
malformed messages, and the signatures on commands and reports.

Django-free: the agent imports it, and so does the portal.
"""
