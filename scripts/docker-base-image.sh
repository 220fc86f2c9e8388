#!/usr/bin/env bash
# A local base image from Debian's packages (no image registry is reachable here):
# debootstrap trixie (Python 3.13) and docker import, cached between runs.
set -euo pipefail
TAG="${1:-jobs-engine-base:trixie}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/jobs-engine/docker"
if docker image inspect "$TAG" >/dev/null 2>&1; then
    echo "$TAG"; exit 0
fi
mkdir -p "$CACHE"
if [[ ! -x "$CACHE/rootfs-trixie/usr/bin/python3" ]]; then
    rm -rf "$CACHE/rootfs-trixie"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        trixie "$CACHE/rootfs-trixie" http://deb.debian.org/debian >&2
fi
tar -C "$CACHE/rootfs-trixie" -c . | docker import - "$TAG" >/dev/null
echo "$TAG"
