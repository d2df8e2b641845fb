#!/usr/bin/env bash
# Builds a Kubernetes control plane from Go modules, with the machine's Go: kube-apiserver,
# kube-controller-manager, kube-scheduler and kubectl (k8s.io/kubernetes), etcd
# (go.etcd.io/etcd/server/v3), kwok (sigs.k8s.io/kwok) and helm (helm.sh/helm/v4). Prints the
# directory holding the seven binaries on stdout (beside it, share/kwok: kwok's ClusterRole and stages); everything else goes
# to stderr. tests/support/control_plane.py starts them.
#
# The versions live in two small wrapper modules, each with the programs as `tool` lines:
#   scripts/control-plane/go.mod       k8s.io/kubernetes v1.36.3 and the etcd server it pins
#                                      (v3.6.8); k8s.io/kubernetes replaces its staging modules
#                                      (k8s.io/api, client-go, ...) with ./staging/src paths that
#                                      a dependent module does not inherit, so the wrapper
#                                      replaces each with the v0.36.3 release.
#   scripts/control-plane/kwok/go.mod  kwok v0.8.0 with its own pins (its k8s.io modules are
#                                      v0.36.1 and its gRPC newer than Kubernetes'; kept apart
#                                      so neither moves the other's dependencies).
#   scripts/control-plane/helm/go.mod  the helm command v4.3.2 with its own pins (k8s.io modules
#                                      v0.37.2), apart for the same reason.
# Re-pin: edit a version with `go get -tool PKG@VERSION` in that directory, then `go mod tidy`.
#
# Go's module cache and build cache are the default ones (GOMODCACHE, GOCACHE), so a rebuild
# on the same machine compiles nothing. The result is cached under
# ${PDX_CACHE:-$HOME/.cache/pdx}/control-plane/<key>, the key hashing both go.mod/go.sum, the
# Go version and this script.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mods=$here/control-plane
cache=${PDX_CACHE:-$HOME/.cache/pdx}/control-plane
k8s_version=v1.36.3   # must match scripts/control-plane/go.mod (checked below)
kwok_version=v0.8.0   # must match scripts/control-plane/kwok/go.mod (checked below)
helm_version=v4.3.2   # must match scripts/control-plane/helm/go.mod (checked below)
# The Prometheus Operator's published CRDs (PodMonitor, ServiceMonitor, PrometheusRule), as its
# Go module ships them (example/prometheus-operator-crd): pdx renders PodMonitors and the chart
# a ServiceMonitor and a PrometheusRule; tests/cluster installs the CRDs to have them accepted.
prometheus_operator=github.com/prometheus-operator/prometheus-operator@v0.85.0
bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok helm)

log() { echo "build-control-plane: [${SECONDS}s] $*" >&2; }
die() { log "$*"; exit 1; }

command -v go >/dev/null || die "needs Go >= 1.26 on PATH (the go command)"
export GOTOOLCHAIN=local   # the machine's Go; never fetch another toolchain
go_version=$(go env GOVERSION)
case $go_version in
  go1.2[6-9]* | go1.[3-9][0-9]*) ;;
  *) die "needs Go >= 1.26, found $go_version" ;;
esac

key=$( (cat "$mods/go.mod" "$mods/go.sum" "$mods/kwok/go.mod" "$mods/kwok/go.sum" \
         "$mods/helm/go.mod" "$mods/helm/go.sum" "$0"
        echo "$go_version $(go env GOOS)/$(go env GOARCH)") | sha256sum | cut -c1-16)
out=$cache/$key
built() {
  [ -f "$out/ok" ] || return 1
  local b
  for b in "${bins[@]}"; do [ -x "$out/bin/$b" ] || return 1; done
  [ -f "$out/share/kwok/rbac.yaml" ] && [ -f "$out/share/prometheus-operator/podmonitors.yaml" ]
}
if built; then echo "$out/bin"; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9   # one build at a time per cache; a second caller waits and then finds it built
if built; then echo "$out/bin"; exit 0; fi

grep -Eq "^\s+k8s.io/kubernetes $k8s_version( |\$)" "$mods/go.mod" ||
  die "scripts/control-plane/go.mod does not require k8s.io/kubernetes $k8s_version"
grep -Eq "^\s+sigs.k8s.io/kwok $kwok_version( |\$)" "$mods/kwok/go.mod" ||
  die "scripts/control-plane/kwok/go.mod does not require sigs.k8s.io/kwok $kwok_version"
grep -Eq "^\s+helm.sh/helm/v4 $helm_version( |\$)" "$mods/helm/go.mod" ||
  die "scripts/control-plane/helm/go.mod does not require helm.sh/helm/v4 $helm_version"

started=$SECONDS
rm -rf "$cache"/build.*   # left by a killed build (we hold the lock: no build is running)
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/out/bin" "$work/tmp"

export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOTMPDIR=$work/tmp
build=(go build -p 2 -trimpath)

# What `kube-apiserver --version`, /version and `kubectl version` report (as Kubernetes' own
# hack/lib/version.sh sets it); without it the server says v0.0.0-master, which Helm's
# kubeVersion checks and kubectl's skew warning read.
k8s_minor=${k8s_version#v1.}; k8s_minor=${k8s_minor%%.*}
k8s_ldflags="-s"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  k8s_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=none"
done

log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $k8s_version ($go_version, -p 2)"
(cd "$mods" && "${build[@]}" -ldflags="$k8s_ldflags" -o "$work/out/bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl >&2) ||
  die "go build of k8s.io/kubernetes $k8s_version failed"
log "building etcd"
(cd "$mods" && "${build[@]}" -ldflags=-s -o "$work/out/bin/etcd" go.etcd.io/etcd/server/v3 >&2) ||
  die "go build of go.etcd.io/etcd/server/v3 failed"
log "building kwok $kwok_version"
(cd "$mods/kwok" && "${build[@]}" -ldflags="-s -X sigs.k8s.io/kwok/pkg/consts.Version=${kwok_version#v}" \
  -o "$work/out/bin/kwok" sigs.k8s.io/kwok/cmd/kwok >&2) ||
  die "go build of sigs.k8s.io/kwok/cmd/kwok failed"
# `helm version` reports what Helm's own Makefile sets (without it: v4.0+unreleased).
log "building helm $helm_version"
(cd "$mods/helm" && "${build[@]}" -ldflags="-s -X helm.sh/helm/v4/internal/version.version=$helm_version \
  -X helm.sh/helm/v4/internal/version.gitTreeState=clean" -o "$work/out/bin/helm" helm.sh/helm/v4/cmd/helm >&2) ||
  die "go build of helm.sh/helm/v4/cmd/helm failed"

# kwok's own ClusterRole and the stages that make it act as a kubelet (nodes Ready, with
# heartbeat Leases; pods Running and Ready, then gone once deleted), from the module just built.
kwok_dir=$(cd "$mods/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok) || die "no sigs.k8s.io/kwok in the module cache"
mkdir -p "$work/out/share/kwok/stages"
cp "$kwok_dir/kustomize/rbac/role.yaml" "$work/out/share/kwok/rbac.yaml"
for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
             pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
  cp "$kwok_dir/kustomize/stage/$stage.yaml" "$work/out/share/kwok/stages/"
done

# The module is only downloaded (checked against Go's checksum database, as any), not built.
log "fetching the CRDs of $prometheus_operator"
po_dir=$(cd "$work/tmp" && GOFLAGS='' go mod download -json "$prometheus_operator" |
  sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p') || die "go mod download $prometheus_operator failed"
[ -d "$po_dir/example/prometheus-operator-crd" ] || die "no example/prometheus-operator-crd in $prometheus_operator"
mkdir -p "$work/out/share/prometheus-operator"
for crd in podmonitors servicemonitors prometheusrules; do
  cp "$po_dir/example/prometheus-operator-crd/monitoring.coreos.com_$crd.yaml" "$work/out/share/prometheus-operator/$crd.yaml"
done
chmod -R u+w "$work/out/share"

cp "$mods/go.mod" "$work/out/go.mod"
cp "$mods/kwok/go.mod" "$work/out/kwok.go.mod"
cp "$mods/helm/go.mod" "$work/out/helm.go.mod"
echo "$go_version built in $((SECONDS - started)) s" >"$work/out/ok"
rm -rf "$out" && mv "$work/out" "$out"

# Keep only the current build.
for old in "$cache"/*/ok; do
  dir=$(dirname "$old"); [ "$dir" = "$out" ] || rm -rf "$dir"
done
log "built in $((SECONDS - started)) s: $out/bin ($(du -sh "$out/bin" | cut -f1))"
echo "$out/bin"
