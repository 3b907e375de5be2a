#!/bin/sh
# The portal image's roles. docker-compose.yml runs `web` and `worker`; anything
# else is run as a command (e.g. `manage createsuperuser`).
#
#   web      migrate (unless LABPORTAL_MIGRATE_ON_START=false), then gunicorn on :8000
#   worker   the control worker with Celery beat (queue "control")
#   manage   python manage.py ARGS...
set -eu

role="${1:-web}"
[ $# -gt 0 ] && shift
# The healthcheck reads which role this container plays.
echo "$role" >/tmp/labportal-role

case "$role" in
  web)
    if [ "${LABPORTAL_MIGRATE_ON_START:-true}" = "true" ]; then
      python3 manage.py migrate --noinput
    fi
    exec gunicorn labportal.wsgi:application \
      --bind "${GUNICORN_BIND:-0.0.0.0:8000}" \
      --workers "${GUNICORN_WORKERS:-3}" \
      --timeout "${GUNICORN_TIMEOUT:-60}" \
      --access-logfile - "$@"
    ;;
  worker)
    exec celery -A labportal worker --beat --queues control \
      --concurrency "${CELERY_CONCURRENCY:-2}" \
      --schedule "${LABPORTAL_VAR_DIR}/celerybeat-schedule" \
      --hostname "control@%h" --loglevel "${LOG_LEVEL:-INFO}" "$@"
    ;;
  manage)
    exec python3 manage.py "$@"
    ;;
  *)
    exec "$role" "$@"
    ;;
esac
