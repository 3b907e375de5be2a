#!/usr/bin/env bash
# Build the guided first job's image labportal/hello-gpu:test from the sample
# deploy/images/hello-gpu/Dockerfile on the debootstrap base, without a registry, and run it
# once: it must print the GPU line and exit 0 (no GPU here: it says its work is CPU work).
#
# Contract: after a zero exit the image exists and its job ran. Light: one COPY layer.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE="${LABPORTAL_HELLO_GPU_IMAGE:-labportal/hello-gpu:test}"
BASE_IMAGE="${LABPORTAL_BASE_IMAGE:-labportal/debian-base:bookworm}"
log() { echo "hello-gpu-image: $*" >&2; }

bash .ci/debian-base.sh
docker build -q --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$IMAGE" deploy/images/hello-gpu >/dev/null
out="$(docker run --rm -e HELLO_GPU_SECONDS=1 -e CUDA_VISIBLE_DEVICES=0 "$IMAGE")"
echo "$out" | grep -q '^GPUs given to this job: CUDA_VISIBLE_DEVICES=0$' || {
  log "the image's job did not print its GPU line:"; echo "$out" >&2; exit 1; }
echo "$out" | grep -q '^CPU work, not GPU work: ' || {
  log "the image's job did not say its work ran on the CPU:"; echo "$out" >&2; exit 1; }
log "built $IMAGE and ran its job"
