#!/usr/bin/env bash
# The local stand-in for python:3.11-slim-bookworm, made from Debian's own packages, for
# machines that reach Debian's archive but no registry of base images (this project's CI).
# It holds what the operator and router Dockerfiles rely on and nothing more: python3.11 as
# `python`, its venv module with ensurepip's pip, and CA certificates.
#
#   images/base/build-base.sh TAG
#
# Builds the root filesystem with debootstrap (variant minbase), drops apt's caches, package
# lists, documentation and locales (as the slim images do), and commits the tree with buildah
# as TAG. The caller names TAG after this file's hash, so an edit here makes a new base.
set -euo pipefail
tag=${1:?usage: build-base.sh TAG}
suite=bookworm
# The Debian mirror this machine's apt uses (deb822 or one-line sources).
mirror=${PDX_DEBIAN_MIRROR:-$(
  { cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true; } \
    | awk '$1 == "URIs:" { print $2 } $1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; break } }' \
    | grep -v security | head -n1 || true
)}
if [ -z "$mirror" ]; then
  echo "build-base: no Debian mirror in /etc/apt sources; set PDX_DEBIAN_MIRROR" >&2
  exit 2
fi

work=$(mktemp -d)
ctr=""
cleanup() {
  [ -n "$ctr" ] && buildah rm "$ctr" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

root=$work/root
debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
  "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/log/* \
  "$root"/usr/share/man "$root"/usr/share/info "$root"/usr/share/locale "$root"/tmp/*
# Documentation goes, the licences stay.
find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
: >"$root/etc/resolv.conf"

ctr=$(buildah from scratch)
mnt=$(buildah mount "$ctr")
tar -C "$root" -c . | tar -C "$mnt" -x
buildah umount "$ctr" >/dev/null
buildah config \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env LANG=C.UTF-8 \
  --label org.opencontainers.image.description="Debian ${suite} minbase with python3.11 and venv, built by pdx's images/base/build-base.sh" \
  --cmd python3 "$ctr"
buildah commit --quiet --squash "$ctr" "$tag" >/dev/null
echo "build-base: $tag from Debian ${suite} ($(du -sh "$root" | cut -f1))"
