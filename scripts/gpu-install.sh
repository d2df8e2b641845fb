#!/usr/bin/env bash
# Installs pdx's offline wheelhouse (`pdx local wheelhouse`) on a GPU machine without network:
# vLLM, NIXL and the rest into a --target folder, beside the image's own torch. The wheelhouse
# arrives as part folders c1, c2, ... one transfer at a time (docs/gpu.md, "Offline install on an
# air-gapped GPU machine").
#
#   gpu-install.sh stage PART_DIR                      copy one arrived part into the staging folder
#   gpu-install.sh verify                              join split wheels, check every sha256
#   gpu-install.sh install [--target DIR] [--pdx SRC]  verify, install, import-check, print the env
#
# PDX_STAGE: the staging folder (/tmp/pdx-stage). PYTHON: the image's interpreter (python3).
# install: --target defaults to /tmp/site, --pdx to the current folder (a pdx checkout); --no-pdx
# installs the wheels alone.
set -euo pipefail

STAGE=${PDX_STAGE:-/tmp/pdx-stage}
PY=${PYTHON:-python3}

die() {
  echo "gpu-install: $*" >&2
  exit 2
}

usage() {
  sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

# The parts (from parts.txt, which c1 brings) that have a file not yet in the staging folder.
missing_parts() {
  local part file missing=()
  if [[ ! -f $STAGE/parts.txt ]]; then
    echo "c1"
    return
  fi
  while read -r part file; do
    [[ -e $STAGE/$file ]] && continue
    [[ " ${missing[*]} " == *" $part "* ]] || missing+=("$part")
  done <"$STAGE/parts.txt"
  echo "${missing[*]}"
}

stage() {
  local src=${1:-}
  [[ -n $src ]] || die "stage: which part? gpu-install.sh stage PART_DIR"
  [[ -d $src ]] || die "stage $src: no such folder"
  mkdir -p "$STAGE"
  cp -f -- "$src"/* "$STAGE"/
  local files size missing
  files=$(find "$STAGE" -maxdepth 1 -type f | wc -l)
  size=$(du -sm "$STAGE" | cut -f1)
  echo "gpu-install: staged $(basename "$src"): $files files, $size MiB in $STAGE"
  missing=$(missing_parts)
  if [[ -n $missing ]]; then
    echo "gpu-install: still to stage: $missing"
  else
    echo "gpu-install: every part staged; next: gpu-install.sh install"
  fi
}

# Join NAME.whl.part0, .part1, ... into NAME.whl, in order. The pieces stay: a part staged again
# later (the same or another wheelhouse) is joined again from whole pieces, never from a mix.
join_pieces() {
  local first whole i
  for first in "$STAGE"/*.whl.part0; do
    [[ -e $first ]] || continue
    whole=${first%.part0}
    i=0
    : >"$whole.joining"
    while [[ -f $whole.part$i ]]; do
      cat "$whole.part$i" >>"$whole.joining"
      i=$((i + 1))
    done
    mv -f "$whole.joining" "$whole"
    echo "gpu-install: joined $(basename "$whole") from $i pieces"
  done
}

verify() {
  local missing
  missing=$(missing_parts)
  [[ -z $missing ]] || die "parts not staged yet: $missing (gpu-install.sh stage PART_DIR, one per part)"
  join_pieces
  (cd "$STAGE" && sha256sum --quiet --strict -c SHA256SUMS) \
    || die "a wheel differs from its sha256 (above): stage the part that brings it again"
  echo "gpu-install: $(wc -l <"$STAGE/SHA256SUMS") wheels match their sha256 in $STAGE"
}

# The folder with the libcudart NIXL's UCX loads (the image's nvidia-cuda-runtime wheel).
cudart_dir() {
  local major=$1 target=$2
  "$PY" - "$major" "$target" <<'PY'
import glob, os, site, sys
major, target = sys.argv[1], sys.argv[2]
for d in [target, *site.getsitepackages(), *sys.path]:
    for f in sorted(glob.glob(os.path.join(d, "nvidia", "**", f"libcudart.so.{major}"), recursive=True)):
        print(os.path.dirname(f))
        raise SystemExit
PY
}

check_torch() {
  local have
  have=$("$PY" - <<'PY'
import sys
import torch
print(f"{sys.version_info[0]}.{sys.version_info[1]} {torch.__version__.split('+')[0]}")
PY
) || die "$PY has no torch: this wheelhouse installs beside the image's torch"
  [[ $have == "$PDX_WH_PYTHON $PDX_WH_TORCH" ]] \
    || die "the wheelhouse is for Python $PDX_WH_PYTHON with torch $PDX_WH_TORCH, $PY has $have:" \
      "build it again with --python ${have% *} --torch ${have#* }"
}

install() {
  local target=/tmp/site pdx_src=$PWD
  while (($#)); do
    case $1 in
      --target)
        target=${2:?--target DIR}
        shift 2
        ;;
      --pdx)
        pdx_src=${2:?--pdx SRC}
        shift 2
        ;;
      --no-pdx)
        pdx_src=""
        shift
        ;;
      *) die "install: unknown option $1 (--target DIR, --pdx SRC, --no-pdx)" ;;
    esac
  done
  if [[ -n $pdx_src && ! -f $pdx_src/pyproject.toml ]]; then
    die "--pdx $pdx_src: no pyproject.toml there; pass pdx's checkout (--pdx SRC) or --no-pdx"
  fi
  verify
  # shellcheck source=/dev/null
  source "$STAGE/wheelhouse.env"
  check_torch
  local wheels=() start
  mapfile -t wheels < <(awk '{print $2}' "$STAGE/SHA256SUMS")
  mkdir -p "$target"
  target=$(cd "$target" && pwd)
  start=$(date +%s)
  (cd "$STAGE" && "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$target" "${wheels[@]}")
  echo "gpu-install: ${#wheels[@]} wheels installed into $target in $(($(date +%s) - start)) s"
  if [[ -n $pdx_src ]]; then
    # pyproject says Python 3.11, which pdx's own venv uses; its code runs on 3.12 too
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --ignore-requires-python --no-compile \
      --no-cache-dir --upgrade --target "$target" "$pdx_src"
    echo "gpu-install: pdx installed from $pdx_src"
  fi
  local cudart
  cudart=$(cudart_dir "$PDX_WH_CUDA" "$target")
  [[ -n $cudart ]] || die "no libcudart.so.$PDX_WH_CUDA under $PY's site-packages; NIXL needs it on LD_LIBRARY_PATH"
  cat >"$target/pdx-env.sh" <<EOF
# source this before starting vLLM from $target (written by gpu-install.sh)
export PYTHONPATH=$target\${PYTHONPATH:+:\$PYTHONPATH}
export LD_LIBRARY_PATH=$cudart\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export VLLM_USE_FLASHINFER_SAMPLER=0  # flashinfer is not carried; vLLM's sampler would import it
EOF
  # shellcheck source=/dev/null
  source "$target/pdx-env.sh"
  "$PY" - "$pdx_src" <<'PY'
import importlib, importlib.metadata as md, importlib.util, sys
import torch
kernels = "vllm._C" if importlib.util.find_spec("vllm._C") else "vllm._C_stable_libtorch"
importlib.import_module(kernels)  # vLLM's CUDA kernels load against the image's torch
import nixl._api  # noqa: F401  (UCX, the NIXL agent)
names = ["vllm", "nixl", "nixl_cu13", "nixl_cu12", "xgrammar", "transformers"]
if sys.argv[1]:
    import pdx_engine, pdx_router  # noqa: F401
    names.append("pdx")
have = []
for name in names:
    try:
        have.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        pass
print(f"gpu-install: imported {kernels}, nixl._api" + (", pdx_engine, pdx_router" if sys.argv[1] else ""))
print(f"gpu-install: torch {torch.__version__} (CUDA {torch.version.cuda}) | " + " | ".join(have))
plugins = sorted(f"{e.name} = {e.value}" for e in md.entry_points(group="vllm.general_plugins"))
print("gpu-install: vllm.general_plugins:" + ("".join(f"\n  {p}" for p in plugins) if plugins else " none"))
PY
  echo "gpu-install: done. The environment ($target/pdx-env.sh):"
  sed -n '2,$p' "$target/pdx-env.sh"
  echo "gpu-install: source $target/pdx-env.sh"
}

case ${1:-} in
  stage)
    shift
    stage "$@"
    ;;
  verify) verify ;;
  install)
    shift
    install "$@"
    ;;
  -h | --help | help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
