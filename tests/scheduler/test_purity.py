"""The engine stays pure: importing it loads no Django, database or Celery module."""

import subprocess
import sys


def test_importing_the_scheduler_loads_no_django_database_or_celery_module() -> None:
    code = (
        "import sys, scheduler, scheduler.simulate, benchmarks.scheduler;"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('django', 'celery', 'kombu', 'psycopg', 'redis', 'rest_framework')];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
