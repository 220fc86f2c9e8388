#!/usr/bin/env bash
# A local base image from Debian's packages (no image registry is reachable here):
# debootstrap trixie with the packages given, then docker import; cached between runs.
#
#   scripts/docker-base-image.sh TAG PACKAGE,PACKAGE...
#   e.g. jobs-engine-base:trixie python3,python3-venv,ca-certificates
set -euo pipefail
TAG="$1"
PACKAGES="$2"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/jobs-engine/docker"
if docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "$TAG"; exit 0
fi
ROOTFS="$CACHE/rootfs-$(echo "$TAG" | tr ':/' '--')"
mkdir -p "$CACHE"
if [[ ! -f "$ROOTFS/.complete" ]]; then
    rm -rf "$ROOTFS"
    debootstrap --variant=minbase --include="$PACKAGES" trixie "$ROOTFS" \
        http://deb.debian.org/debian >&2
    touch "$ROOTFS/.complete"
fi
tar -C "$ROOTFS" --exclude=./.complete -c . | docker import - "$TAG" >/dev/null
echo "$TAG"
