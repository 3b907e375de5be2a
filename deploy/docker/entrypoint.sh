#!/bin/sh
# The portal image's roles. docker-compose.yml runs `web` and `worker`; anything
# else is run as a command (e.g. `manage createsuperuser`).
#
#   web      migrate (unless LABPORTAL_MIGRATE_ON_START=false), then uvicorn (ASGI: pages, API, the sessions proxy) on :8000
#   worker   the control worker (queue "control"); scale or restart it freely
#   beat     Celery beat, the periodic work (passes, liveness, credits, backups); exactly one
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
    # ASGI (labportal/asgi.py): the sessions proxy holds WebSockets open, which a
    # synchronous worker cannot. WEB_WORKERS processes, each serving many connections.
    # WEB_BIND is HOST:PORT (the healthcheck reads the same variable).
    bind="${WEB_BIND:-0.0.0.0:8000}"
    exec uvicorn labportal.asgi:application \
      --host "${bind%:*}" --port "${bind##*:}" \
      --workers "${WEB_WORKERS:-${GUNICORN_WORKERS:-3}}" \
      --proxy-headers --forwarded-allow-ips "${FORWARDED_ALLOW_IPS:-127.0.0.1}" "$@"
    ;;
  worker)
    exec celery -A labportal worker --queues control \
      --concurrency "${CELERY_CONCURRENCY:-2}" \
      --hostname "control@%h" --loglevel "${LOG_LEVEL:-INFO}" "$@"
    ;;
  beat)
    exec celery -A labportal beat \
      --schedule "${LABPORTAL_VAR_DIR}/celerybeat-schedule" \
      --loglevel "${LOG_LEVEL:-INFO}" "$@"
    ;;
  manage)
    exec python3 manage.py "$@"
    ;;
  *)
    exec "$role" "$@"
    ;;
esac
