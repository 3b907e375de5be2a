"""labctl: the LabPortal command line over the REST API (stdlib + requests, no Django)."""

__version__ = "1.0"
