#!/usr/bin/env bash
# Build the Debian base image that the portal and agent Dockerfiles take as
# BASE_IMAGE, without an image registry: debootstrap from Debian's packages,
# then `docker import`.
#
# Contract: after a zero exit the image $LABPORTAL_BASE_IMAGE (default
# labportal/debian-base:bookworm) exists. A second run on a machine that has it
# returns at once. Needs root, debootstrap and a Debian mirror.
set -euo pipefail

IMAGE="${LABPORTAL_BASE_IMAGE:-labportal/debian-base:bookworm}"
SUITE="${DEBIAN_SUITE:-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
log() { echo "debian-base: $*" >&2; }

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "image $IMAGE already present"
  exit 0
fi
command -v debootstrap >/dev/null || {
  log "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 -qq install -y debootstrap >/dev/null
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
log "debootstrap $SUITE from $MIRROR (a few minutes)"
# What every LabPortal image needs, so the Dockerfiles need no apt mirror:
# Python with venv, TLS roots, and pg_dump/pg_restore for backups.
debootstrap --variant=minbase \
  --include=python3,python3-venv,ca-certificates,postgresql-client,tini \
  "$SUITE" "$work/root" "$MIRROR" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  exit 1
}
echo "deb $MIRROR $SUITE main" >"$work/root/etc/apt/sources.list"
# Local certificate authorities this machine trusts (e.g. a TLS-intercepting egress
# proxy's) are trusted by the image too, so `pip install` in the Dockerfiles works here.
if compgen -G "${EXTRA_CA_DIR:-/usr/local/share/ca-certificates}/*.crt" >/dev/null; then
  cp "${EXTRA_CA_DIR:-/usr/local/share/ca-certificates}"/*.crt "$work/root/usr/local/share/ca-certificates/"
  chroot "$work/root" update-ca-certificates >/dev/null
fi
rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
tar --numeric-owner -C "$work/root" -cf "$work/root.tar" .
docker import \
  --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  "$work/root.tar" "$IMAGE" >/dev/null
log "built image $IMAGE ($(docker image inspect --format '{{.Size}}' "$IMAGE") bytes)"
