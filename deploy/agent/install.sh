#!/usr/bin/env bash
# Install (or update) the LabPortal node agent on a GPU server, in one command:
#
#   sudo deploy/agent/install.sh --broker redis://portal.lab:6379/0 --token NODE_TOKEN [--name gpu01]
#
# It creates the system user labportal-agent, installs the agent into
# /opt/labportal-agent/venv, writes /etc/labportal-agent/agent.env and starts
# the systemd service. Running it again updates the code and the settings.
# See docs/agent.md for every option.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: sudo install.sh --broker URL --token TOKEN [options]

  --broker URL          the portal's Celery broker, e.g. redis://portal.lab:6379/0 (required)
  --token TOKEN         the node token an admin created in the portal (required)
  --name NAME           this node's name in the portal (default: the short hostname)
  --gpu-backend KIND    nvml (default), auto or simulated
  --runtime KIND        docker (default) or local (demo only; adds --allow-local-runtime)
  --allowed-mount-roots DIRS   required: colon-separated roots jobs may mount from, or none
  --monitor-only        telemetry only, for a Slurm node: no container runtime, no jobs
  --source SPEC         a checkout, or what pip installs: an agent wheel or URL
                        (default: the checkout this script is in)
  --no-start            install and configure, but do not (re)start the service
USAGE
}

BROKER="" TOKEN="" NAME="$(hostname -s)" GPU_BACKEND="nvml" RUNTIME="docker"
MOUNT_ROOTS="" START=1 MONITOR_ONLY=0
SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PREFIX=/opt/labportal-agent
CONF_DIR=/etc/labportal-agent
UNIT=/etc/systemd/system/labportal-agent.service

while [ $# -gt 0 ]; do
  case "$1" in
    --broker) BROKER="$2"; shift 2 ;;
    --token) TOKEN="$2"; shift 2 ;;
    --name) NAME="$2"; shift 2 ;;
    --gpu-backend) GPU_BACKEND="$2"; shift 2 ;;
    --runtime) RUNTIME="$2"; shift 2 ;;
    --allowed-mount-roots) MOUNT_ROOTS="$2"; shift 2 ;;
    --source) SOURCE="$2"; shift 2 ;;
    --no-start) START=0; shift ;;
    --monitor-only) MONITOR_ONLY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

die() { echo "install.sh: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run it as root (sudo): it creates a user and a systemd service"
[ -n "$BROKER" ] || die "--broker is required, e.g. --broker redis://portal.lab:6379/0"
[ -n "$TOKEN" ] || die "--token is required: create a node token in the portal's admin first"
[ -n "$MOUNT_ROOTS" ] || [ "$MONITOR_ONLY" -eq 1 ] || die "--allowed-mount-roots is required, e.g. /data:/home (or none to allow no mounts)"
case "$TOKEN$BROKER$NAME" in *$'\n'*) die "values must be single lines" ;; esac

# Python 3.11+ with venv.
PY="$(command -v python3 || true)"
[ -n "$PY" ] || die "python3 is missing; install Python 3.11 or newer"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || die "Python 3.11 or newer is needed ($("$PY" --version) found)"
if ! "$PY" -m venv --help >/dev/null 2>&1 || ! "$PY" -c 'import ensurepip' >/dev/null 2>&1; then
  if command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
  else
    die "python3's venv module is missing; install it (python3-venv)"
  fi
fi

if [ "$RUNTIME" = "docker" ] && [ "$MONITOR_ONLY" -eq 0 ]; then
  command -v docker >/dev/null || echo "install.sh: warning: docker is not installed; jobs cannot start until it is" >&2
  if [ "$GPU_BACKEND" != "simulated" ] && ! command -v nvidia-ctk >/dev/null && ! command -v nvidia-container-toolkit >/dev/null; then
    echo "install.sh: warning: the NVIDIA Container Toolkit was not found; containers will not see GPUs" >&2
  fi
fi

# The service account: no shell, no home login; docker group for the engine socket.
getent group labportal-agent >/dev/null || groupadd --system labportal-agent
if ! id labportal-agent >/dev/null 2>&1; then
  useradd --system --gid labportal-agent --home-dir /var/lib/labportal-agent \
    --shell /usr/sbin/nologin labportal-agent
fi
getent group docker >/dev/null || groupadd --system docker

# The code. Only the agent's dependencies: a GPU server needs no Django.
mkdir -p "$PREFIX"
[ -x "$PREFIX/venv/bin/python" ] || "$PY" -m venv "$PREFIX/venv"
"$PREFIX/venv/bin/pip" install -q --upgrade pip
# A checkout installs its agent distribution (distributions/agent: agent/ and protocol/), with
# the dependencies from its lock (requirements/agent.txt); any other SPEC (a wheel, a URL) as
# it is, with the dependencies it names.
SPEC="$SOURCE"
[ -f "$SOURCE/distributions/agent/pyproject.toml" ] && SPEC="$SOURCE/distributions/agent"
# Installs before the agent had a distribution of its own put the whole labportal one here;
# it goes first, as it holds the same agent/ and protocol/ files.
"$PREFIX/venv/bin/pip" uninstall -q -y labportal >/dev/null 2>&1 || true
if [ -f "$SOURCE/requirements/agent.txt" ]; then
  # A checkout's libraries come from its lock, hash-checked (the versions the tests ran).
  # The lock is the whole closure: --no-deps, then pip check (older pips refuse a dependency
  # asked for with an extra in hash-checking mode).
  "$PREFIX/venv/bin/pip" install -q --require-hashes --no-deps -r "$SOURCE/requirements/agent.txt"
  "$PREFIX/venv/bin/pip" install -q --upgrade --no-deps "$SPEC"
  "$PREFIX/venv/bin/pip" check
else
  "$PREFIX/venv/bin/pip" install -q --upgrade "$SPEC"
fi
if [ -f "$SOURCE/docs/agent.md" ]; then
  mkdir -p "$PREFIX/docs"
  cp "$SOURCE/docs/agent.md" "$PREFIX/docs/"
fi

# The settings. Written atomically, readable by root and the agent only.
mkdir -p "$CONF_DIR"
tmp="$(mktemp "$CONF_DIR/.agent.env.XXXXXX")"
{
  echo "# Written by deploy/agent/install.sh on $(date -u +%FT%TZ). See docs/agent.md."
  echo "LABPORTAL_NODE_NAME=$NAME"
  echo "LABPORTAL_BROKER_URL=$BROKER"
  echo "LABPORTAL_NODE_TOKEN=$TOKEN"
  echo "LABPORTAL_GPU_BACKEND=$GPU_BACKEND"
  echo "LABPORTAL_RUNTIME=$RUNTIME"
  [ "$RUNTIME" = "local" ] && echo "LABPORTAL_ALLOW_LOCAL_RUNTIME=1"
  [ -n "$MOUNT_ROOTS" ] && echo "LABPORTAL_ALLOWED_MOUNT_ROOTS=$MOUNT_ROOTS"
  [ "$MONITOR_ONLY" -eq 1 ] && echo "LABPORTAL_MONITOR_ONLY=1"
  true
} >"$tmp"
chown root:labportal-agent "$tmp"
chmod 0640 "$tmp"
mv "$tmp" "$CONF_DIR/agent.env"

install -m 0644 "$(dirname "${BASH_SOURCE[0]}")/labportal-agent.service" "$UNIT"

# A dry run as the service user: it finds the GPUs, or says why not.
if ! runuser -u labportal-agent -- env LABPORTAL_GPU_BACKEND="$GPU_BACKEND" \
  "$PREFIX/venv/bin/labportal-agent" --print-info --name "$NAME" >/dev/null; then
  die "the agent could not start its GPU backend (see above); fix that, then run this again"
fi

systemctl daemon-reload
if [ "$START" -eq 1 ]; then
  systemctl enable --quiet labportal-agent
  systemctl restart labportal-agent
  echo "install.sh: labportal-agent is running as node $NAME; follow it with: journalctl -fu labportal-agent"
else
  echo "install.sh: installed; start it with: systemctl enable --now labportal-agent"
fi
