#!/usr/bin/env bash
# A real Kubernetes 1.36 control plane on loopback, to try pdx with kubectl (docs/control-plane.md):
#   scripts/control-plane.sh up [--gpu-nodes N] [--cpu-nodes N] [--keep]
# builds it if needed (scripts/build-control-plane.sh: tens of minutes the first time, cached
# after), starts etcd, kube-apiserver (RBAC on), kube-controller-manager, kube-scheduler and kwok,
# creates kwok nodes (2 p5en.48xlarge, 1 CPU by default), prints `export KUBECONFIG=...` and runs
# until Ctrl-C, which stops everything and removes its directory.
#   scripts/control-plane.sh build    # only build; prints the bin directory
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
[ -x "$py" ] || { echo "control-plane.sh: no .venv (run make setup)" >&2; exit 1; }
exec "$py" -m tests.support.control_plane "${@:-up}"
