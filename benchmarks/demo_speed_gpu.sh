#!/usr/bin/env bash
# Decode tokens/s of the main job's model on a GPU box that has torch + transformers but no network, no
# GGUF file and only a runtime TVM: `mxgemm demo --speed-only` (SmolLM2-135M-Instruct's architecture,
# random weights): fp16 nn.Linear and each format's MxLinear, eager and with the decode step in a CUDA graph.
#
# Before, on a box with nvcc (no GPU needed), build every CUDA kernel the run needs into .gpu_cache
# (the formats must match the run's; scale modes need no other kernel):
#   MXGEMM_CACHE_DIR=$PWD/.gpu_cache python -m mxgemm.cli demo --speed-only --build-only --arch sm_90 \
#       --formats mxfp4,mxfp8_e4m3
# and the runtime TVM (benchmarks/device_kit.sh, unpacked into /tmp/site there).
# On the GPU box, from the repository root:
#   benchmarks/demo_speed_gpu.sh OUT_DIR [FORMATS]
# writes OUT_DIR/demo-speed.{txt,json} (the table; rows, GPU, versions) and OUT_DIR/log.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: benchmarks/demo_speed_gpu.sh OUT_DIR [FORMATS]}
formats=${2:-mxfp4,mxfp8_e4m3}
mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD MXGEMM_CACHE_DIR=${MXGEMM_CACHE_DIR:-$PWD/.gpu_cache}
python3 -m mxgemm.cli demo --speed-only --device cuda --formats "$formats" --out "$out" 2>&1 | tee "$out/log.txt"
