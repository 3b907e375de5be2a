#!/usr/bin/env bash
# Prepare a local Docker engine and the offline test image for the agent tests.
#
# Contract: after a zero exit, `docker info` works and the image
# labportal/busybox:test exists. Safe to run again: each step checks first,
# so a second run on a ready machine takes about a second.
# No registry is reachable in CI, so the image is built with `docker import`
# from Debian's busybox-static instead of being pulled.
set -euo pipefail

IMAGE="${LABPORTAL_TEST_IMAGE:-labportal/busybox:test}"
DOCKERD_LOG="${DOCKERD_LOG:-/var/log/labportal-dockerd.log}"
WAIT_S="${DOCKER_WAIT_S:-60}"

log() { echo "docker-setup: $*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Other jobs on the machine may hold the dpkg/apt locks: wait for them
# (DPkg::Lock::Timeout) and retry the whole step a few times rather than fail.
apt_get() {
  local attempt
  for attempt in 1 2 3 4 5; do
    if as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 -qq "$@"; then
      return 0
    fi
    log "apt-get $1 failed (attempt $attempt); retrying in 5s"
    sleep 5
  done
  return 1
}

apt_updated=0
apt_install() {
  if [ "$apt_updated" -eq 0 ]; then
    apt_get update
    apt_updated=1
  fi
  apt_get install -y --no-install-recommends "$@" >/dev/null
}

# 1. Packages. dockerd comes from docker.io; a docker CLI alone is not enough.
missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
[ -x /bin/busybox ] || missing+=(busybox-static)
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]}"
  apt_install "${missing[@]}"
fi

# 2. The daemon. Started in the background only when `docker info` fails.
if ! docker info >/dev/null 2>&1; then
  if ! pgrep -x dockerd >/dev/null 2>&1; then
    log "starting dockerd (log: $DOCKERD_LOG)"
    # setsid detaches it from this script's session so CI's shell can exit.
    as_root setsid dockerd >"$DOCKERD_LOG" 2>&1 </dev/null &
  fi
  for _ in $(seq 1 "$WAIT_S"); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  if ! docker info >/dev/null 2>&1; then
    log "dockerd did not become ready within ${WAIT_S}s; last lines of $DOCKERD_LOG:"
    tail -n 30 "$DOCKERD_LOG" >&2 || true
    exit 1
  fi
fi
log "docker engine ready ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"

# 3. The test image, built offline from busybox-static.
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "image $IMAGE already present"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root/bin" "$work/root/tmp" "$work/root/etc"
cp /bin/busybox "$work/root/bin/busybox"
for applet in sh ash sleep echo cat id ls ps kill true false env printf touch \
  mkdir rm stat wc head tail grep sed seq date whoami test yes; do
  ln -sf busybox "$work/root/bin/$applet"
done
chmod 1777 "$work/root/tmp"
# Minimal passwd/group so `id` and `whoami` work for root; other uids print numerically.
echo 'root:x:0:0:root:/root:/bin/sh' >"$work/root/etc/passwd"
echo 'root:x:0:' >"$work/root/etc/group"
tar -C "$work/root" -cf "$work/busybox.tar" .
docker import \
  --change 'ENV PATH=/bin' \
  --change 'CMD ["/bin/sh"]' \
  "$work/busybox.tar" "$IMAGE" >/dev/null
log "built image $IMAGE"
