#!/usr/bin/env bash
# Build .devkit/site.tar.xz: a runtime-only TVM (the apache-tvm wheel without libtvm_compiler.so) with
# apache-tvm-ffi, platformdirs and the [rpc] extra for Python 3.12, ~7 MiB, for a GPU box that has torch
# but no network and no TVM. Kernels are built here (nvcc, no GPU needed) into $MXGEMM_CACHE_DIR and carried with it.
# On the GPU box: mkdir -p /tmp/site && tar xJf .devkit/site.tar.xz -C /tmp/site &&
#   export PYTHONPATH=/tmp/site:$PWD MXGEMM_CACHE_DIR=$PWD/.gpu_cache
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON_VERSION:-3.12}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    -d "$work/whl" apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 platformdirs \
    tornado psutil cloudpickle  # the [rpc] extra: `mxgemm tune --rpc` and `mxgemm rpc-server` there
mkdir "$work/site"
for w in "$work"/whl/*.whl; do python3 -m zipfile -e "$w" "$work/site"; done
rm "$work/site/tvm/lib/libtvm_compiler.so"
mkdir -p .devkit
tar cJf .devkit/site.tar.xz -C "$work/site" .
mkdir -p .git/info
grep -qx '/.devkit/' .git/info/exclude 2>/dev/null || echo '/.devkit/' >> .git/info/exclude
grep -qx '/.gpu_cache/' .git/info/exclude 2>/dev/null || echo '/.gpu_cache/' >> .git/info/exclude
ls -la .devkit/site.tar.xz
