#!/usr/bin/env bash
# Make the git-ignored folders that a call on a GPU host without network carries (docs/gpu-host.md,
# "What to carry"), on a workstation with network. The host runs CPython 3.12 on x86_64 Linux.
#
#   bash tools/gpu-carry.sh [PACK_FA4]     PACK_FA4: FlashAttention-4's packer (../shared/tools/pack-fa4.sh)
#
#   .whl/                           jsonschema and the dependencies the host lacks, at the versions
#                                   installed here (those longca's tests ran with)
#   .whl-linear/                    fla-core at the `gpu` extra's pin (pyproject.toml)
#   .bundles/cudnn-frontend.tar.xz  nvidia-cudnn-frontend at the `gpu` extra's pin, unzipped and packed
#   .bundles/fa4.tar.xz             FlashAttention-4 with its CuTe DSL, by PACK_FA4 (about 5 minutes)
#
# What exists is kept (delete it to make it again), so a second run only fills gaps. PYTHON names
# the interpreter whose installed versions and pip are used (python3 by default).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
pack_fa4=${1:-../shared/tools/pack-fa4.sh}
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

# NAME==VERSION for each name: the `gpu` extra's pin, or (--installed) the version installed here
pins() {
  "$py" - "$@" <<'EOF'
import importlib.metadata, re, sys, tomllib
installed = sys.argv[1] == "--installed"
names = sys.argv[2:] if installed else sys.argv[1:]
gpu = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["gpu"]
pinned = {re.split(r"[\[=<>]", r, maxsplit=1)[0]: r.split("==", 1)[1] for r in gpu if "==" in r}
for name in names:
    if installed:
        print(f"{name}=={importlib.metadata.version(name)}")
    elif name in pinned:
        print(f"{name}=={pinned[name]}")
    else:
        sys.exit(f"gpu-carry: pyproject.toml's gpu extra pins no {name}")
EOF
}

download() {  # DIR REQUIREMENT...
  local dir=$1; shift
  mkdir -p "$dir"
  "$py" -m pip download -q --no-deps "${plat[@]}" -d "$dir" "$@"
}

# `reqs=$(pins ...)` is an assignment so that set -e stops at a failed pin; $reqs splits into requirements
if ! ls .whl/*.whl > /dev/null 2>&1; then
  reqs=$(pins --installed jsonschema jsonschema-specifications referencing rpds-py)
  download .whl $reqs
fi
if ! ls .whl-linear/*.whl > /dev/null 2>&1; then
  reqs=$(pins fla-core)
  download .whl-linear $reqs
fi
mkdir -p .bundles
if [ ! -f .bundles/cudnn-frontend.tar.xz ]; then
  work=$(mktemp -d)
  reqs=$(pins nvidia-cudnn-frontend)
  download "$work/wheel" $reqs
  mkdir "$work/site"
  "$py" -m zipfile -e "$work"/wheel/*.whl "$work/site"
  tar -C "$work/site" -cf - . | xz -9 > .bundles/cudnn-frontend.tar.xz.part
  mv .bundles/cudnn-frontend.tar.xz.part .bundles/cudnn-frontend.tar.xz
  rm -rf "$work"
fi
if [ ! -f .bundles/fa4.tar.xz ]; then
  [ -f "$pack_fa4" ] || { echo "gpu-carry: no FlashAttention-4 packer at $pack_fa4 (give its path)" >&2; exit 2; }
  bash "$pack_fa4" .bundles/fa4.tar.xz
fi
du -sh .whl .whl-linear .bundles/*.tar.xz
