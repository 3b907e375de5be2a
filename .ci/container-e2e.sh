#!/usr/bin/env bash
# The deployment, tested for real without an image registry:
#   1. a Debian base image from debootstrap + docker import (.ci/debian-base.sh, cached);
#   2. the portal and agent images built on it (Dockerfile, Dockerfile.agent);
#   3. docker-compose.yml validated by `docker-compose config` (Debian's docker-compose);
#   4. the web and control-worker containers started against this machine's PostgreSQL
#      and Redis (host networking: both listen on 127.0.0.1), healthchecks passing;
#   5. an admin created in the container, logged in over HTTP, a job submitted and run
#      by the agent container in a Docker container on a simulated GPU (no GPU here);
#   6. `manage.py backup` in the worker container, restored into a new database.
# Everything it starts is removed at the end, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

PG_URL="${CI_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/labportal}"
REDIS_URL="${CI_BROKER_URL:-redis://127.0.0.1:6379/0}"
PORT="${CONTAINER_E2E_PORT:-8601}"
BASE_IMAGE="${LABPORTAL_BASE_IMAGE:-labportal/debian-base:bookworm}"
TEST_IMAGE="${LABPORTAL_TEST_IMAGE:-labportal/busybox:test}"
RUN_ID="lpe2e$$"
DB_NAME="labportal_container_e2e_$$"
PG_SERVER="${PG_URL%/*}"
DB_URL="$PG_SERVER/$DB_NAME"
NODE="ctr-e2e-$$"
ADMIN_PASSWORD="container-e2e-$(date +%s)-pw"
export DOCKER_BUILDKIT=0  # the classic builder is what Debian's docker.io ships

log() { echo "container-e2e: $*" >&2; }
step_start=$(date +%s)
step() { log "[$(( $(date +%s) - step_start ))s] $*"; }

cleanup() {
  local rc=$?
  if [ $rc -ne 0 ]; then
    for c in web worker beat agent; do
      echo "--- $c (last lines)" >&2
      docker logs --tail 40 "$RUN_ID-$c" 2>&1 | sed 's/^/    /' >&2 || true
    done
  fi
  docker rm -f "$RUN_ID-web" "$RUN_ID-worker" "$RUN_ID-beat" "$RUN_ID-agent" >/dev/null 2>&1 || true
  docker ps -aq --filter "label=labportal.node=$NODE" | xargs -r docker rm -f >/dev/null 2>&1 || true
  psql "$PG_SERVER/postgres" -qc "DROP DATABASE IF EXISTS $DB_NAME" >/dev/null 2>&1 || true
  psql "$PG_SERVER/postgres" -qc "DROP DATABASE IF EXISTS ${DB_NAME}_restored" >/dev/null 2>&1 || true
  rm -rf "${cfg_dir:-}"
  exit $rc
}
trap cleanup EXIT

step "base image"
bash .ci/debian-base.sh

step "building labportal/portal:ci and labportal/agent:ci on $BASE_IMAGE"
docker build -q --build-arg BASE_IMAGE="$BASE_IMAGE" -t labportal/portal:ci . >/dev/null
docker build -q --build-arg BASE_IMAGE="$BASE_IMAGE" -f Dockerfile.agent -t labportal/agent:ci . >/dev/null

step "docker-compose config"
command -v docker-compose >/dev/null || {
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 -qq install -y docker-compose >/dev/null
}
cfg_dir="$(mktemp -d)"
cp docker-compose.yml "$cfg_dir/"
sed 's/CHANGE-ME/ci0secret0value/' .env.example >"$cfg_dir/.env"
docker-compose --project-directory "$cfg_dir" -f "$cfg_dir/docker-compose.yml" config -q
services="$(docker-compose --project-directory "$cfg_dir" -f "$cfg_dir/docker-compose.yml" --profile gpu config --services | sort | tr '\n' ' ')"
[ "$services" = "agent beat grafana postgres prometheus redis web worker " ] || {
  log "unexpected services: $services"
  exit 1
}
# .env.example must configure everything the compose file requires (:? variables).
rm "$cfg_dir/.env"
if docker-compose --project-directory "$cfg_dir" -f "$cfg_dir/docker-compose.yml" config -q 2>/dev/null; then
  log "docker-compose.yml accepted a missing .env; required settings must be enforced"
  exit 1
fi

step "database $DB_NAME"
psql "$PG_SERVER/postgres" -qc "CREATE DATABASE $DB_NAME" >/dev/null

portal_env=(
  -e DEBUG=false
  -e SECRET_KEY="container-e2e-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  -e ALLOWED_HOSTS=127.0.0.1,localhost
  -e DATABASE_URL="$DB_URL"
  -e CELERY_BROKER_URL="$REDIS_URL"
  -e WEB_BIND="127.0.0.1:$PORT"
  -e GUNICORN_WORKERS=2
  -e SESSION_COOKIE_SECURE=false
  -e CSRF_COOKIE_SECURE=false
  -e LABPORTAL_ALLOW_SIMULATION=true
  -e LABPORTAL_BACKUP_ENABLED=false
  -e LOG_FORMAT=json
)
step "starting web and control worker (host network)"
docker run -d --name "$RUN_ID-web" --network host --health-interval 2s --health-start-period 120s \
  "${portal_env[@]}" labportal/portal:ci web >/dev/null
wait_healthy() {
  local name=$1 limit=$2
  for _ in $(seq 1 "$limit"); do
    case "$(docker inspect --format '{{.State.Health.Status}}' "$name")" in
      healthy) return 0 ;;
    esac
    [ "$(docker inspect --format '{{.State.Running}}' "$name")" = true ] || { log "$name exited"; return 1; }
    sleep 1
  done
  log "$name not healthy after ${limit}s"
  return 1
}
wait_healthy "$RUN_ID-web" 150  # the web role migrates first
docker run -d --name "$RUN_ID-worker" --network host --health-interval 5s \
  "${portal_env[@]}" labportal/portal:ci worker >/dev/null
docker run -d --name "$RUN_ID-beat" --network host --health-interval 5s \
  "${portal_env[@]}" labportal/portal:ci beat >/dev/null
[ "$(docker exec "$RUN_ID-web" id -u)" != 0 ] || { log "the portal runs as root"; exit 1; }

step "admin, node token and image allow-list inside the web container"
docker exec -e DJANGO_SUPERUSER_PASSWORD="$ADMIN_PASSWORD" "$RUN_ID-web" \
  /opt/labportal/app/deploy/docker/entrypoint.sh manage createsuperuser --noinput \
  --username admin --email admin@lab.example.org >/dev/null
docker exec "$RUN_ID-web" /opt/labportal/app/deploy/docker/entrypoint.sh manage shell --no-imports -c "
from jobqueue.models import ContainerImage
ContainerImage.objects.get_or_create(reference='$TEST_IMAGE')"
# As an enrolment playbook does: the secret alone on standard output.
token="$(docker exec "$RUN_ID-web" /opt/labportal/app/deploy/docker/entrypoint.sh manage node_token issue "$NODE")"

step "agent container (Docker socket, simulated GPUs)"
docker run -d --name "$RUN_ID-agent" --network host \
  --group-add "$(stat -c %g /var/run/docker.sock)" \
  -v /var/run/docker.sock:/var/run/docker.sock \
  labportal/agent:ci --name "$NODE" --broker "$REDIS_URL" --token "$token" \
  --gpu-backend simulated --sim-gpus 2 --heartbeat-interval 2 --allowed-mount-root none >/dev/null
wait_healthy "$RUN_ID-worker" 90
wait_healthy "$RUN_ID-beat" 60

step "log in over HTTP and run a job through the agent"
python3 .ci/container_e2e_http.py "http://127.0.0.1:$PORT" admin "$ADMIN_PASSWORD" "$TEST_IMAGE"

step "backup inside the worker container, restored into a new database"
archive="$(docker exec "$RUN_ID-worker" /opt/labportal/app/deploy/docker/entrypoint.sh manage backup \
  | sed -n 's/^backup written: //p')"
case "$archive" in /var/lib/labportal/backups/labportal-*.tar) ;; *) log "no archive: $archive"; exit 1 ;; esac
psql "$PG_SERVER/postgres" -qc "CREATE DATABASE ${DB_NAME}_restored" >/dev/null
docker exec -e DATABASE_URL="${DB_URL}_restored" "$RUN_ID-worker" \
  /opt/labportal/app/deploy/docker/entrypoint.sh manage restore "$archive" >/dev/null
for table in accounts_user jobqueue_job cluster_node; do
  a="$(psql "$DB_URL" -tAc "SELECT count(*) FROM $table")"
  b="$(psql "${DB_URL}_restored" -tAc "SELECT count(*) FROM $table")"
  [ "$a" = "$b" ] && [ "$a" -gt 0 ] || { log "$table: $a rows, $b after restore"; exit 1; }
done
step "passed"
