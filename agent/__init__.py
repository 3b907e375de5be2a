"""LabPortal node agent.

A Celery worker that runs on each GPU server. It consumes only its own queue
``node.<name>``, starts and stops job containers on the GPUs it is told to use,
samples the GPUs, and reports back by sending tasks by name to the ``control``
queue. It never imports Django or any LabPortal app and needs no database
credentials: everything it knows arrives in task arguments.
"""

__version__ = "0.1.0"
