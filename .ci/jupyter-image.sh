#!/usr/bin/env bash
# Build the session test image labportal/jupyter:test (JupyterLab in a container) from the
# sample deploy/images/jupyter/Dockerfile on the debootstrap base, without a registry.
#
# Contract: after a zero exit the image exists. A second run on a machine that has it
# returns at once. The jupyterlab and ipykernel versions are this checkout's (.venv), so the
# container's server is the one the local-process tests run.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE="${LABPORTAL_JUPYTER_IMAGE:-labportal/jupyter:test}"
BASE_IMAGE="${LABPORTAL_BASE_IMAGE:-labportal/debian-base:bookworm}"
log() { echo "jupyter-image: $*" >&2; }

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "image $IMAGE already present"
  exit 0
fi
bash .ci/debian-base.sh
PY="${PYTHON_FOR_VERSIONS:-.venv/bin/python}"
version() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
start=$(date +%s)
docker build -q \
  --build-arg BASE_IMAGE="$BASE_IMAGE" \
  --build-arg JUPYTERLAB_VERSION="$(version jupyterlab)" \
  --build-arg IPYKERNEL_VERSION="$(version ipykernel)" \
  -t "$IMAGE" deploy/images/jupyter >/dev/null
log "built image $IMAGE in $(( $(date +%s) - start )) s"
