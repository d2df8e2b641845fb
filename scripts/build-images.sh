#!/usr/bin/env bash
# `make images`: builds the operator and router images from images/*/Dockerfile with buildah,
# on a base made here from Debian's packages (images/base/build-base.sh), for machines that
# reach Debian's archive and PyPI but no registry of base images. Users build with docker
# (images/README.md); the Dockerfiles are the same.
#
# Cached: the base is tagged by its recipe's hash and built once per machine; the image
# builds keep their layers (--layers), so an unchanged tree rebuilds in seconds and a source
# edit reinstalls only pdx, not its dependencies.
#
# Prints one line per image: NAME REF SIZE. Exit 3 when buildah cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
  if ! { apt-get update -qq && apt-get install -y -qq buildah debootstrap; } >/dev/null 2>&1; then
    echo "build-images: buildah and debootstrap could not be installed (apt-get install buildah debootstrap)" >&2
    exit 3
  fi
fi

version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
revision=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
base="localhost/pdx-base:bookworm-$(sha256sum images/base/build-base.sh | cut -c1-12)"

if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  images/base/build-base.sh "$base"
fi

# The build's RUN steps reach PyPI through this machine's TLS setup: its CA bundle is mounted
# for the build only, never copied into an image.
ca=/etc/ssl/certs/ca-certificates.crt
for name in operator router; do
  ref="localhost/pdx-$name:$version"
  log=$(mktemp)
  if ! buildah bud --isolation chroot --layers --quiet \
      --volume "$ca:$ca:ro" \
      --build-arg "BASE=$base" --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
      --file "images/$name/Dockerfile" --tag "$ref" . >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    rm -f "$log"
    echo "build-images: $name failed (images/$name/Dockerfile)" >&2
    exit 1
  fi
  rm -f "$log"
  size=$(buildah images --format '{{.Size}}' "$ref")
  echo "$name $ref $size"
done
