#!/usr/bin/env bash
# The GPU tests and the GPU benchmarks in one run, each part under its own time limit; logs and JSON into DIR.
#
#   tests/gpu/run_device_checks.sh DIR [HOST_AOT_DIR] [PREBUILT_TINY_JETSON_BUNDLE]
#
# HOST_AOT_DIR: kernels compiled on a host for this GPU's SM (tests/gpu/test_kernels_gpu.py); the bundle: a tiny
# Jetson bundle built on a host, for machines without the host extra's packages (tests/gpu/test_triton_backend.py).
set -u
out=${1:?usage: run_device_checks.sh DIR [HOST_AOT_DIR] [BUNDLE]}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 EDGESDK_BENCH_OUT="$out"
[ -n "${2:-}" ] && export EDGESDK_HOST_AOT_DIR="$2"
[ -n "${3:-}" ] && export EDGESDK_GPU_TEST_BUNDLE="$3"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv 2>&1 | tee "$out/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"
run() {  # run LIMIT_S NAME pytest-args...
  local limit=$1 name=$2; shift 2
  timeout "$limit" python3 -m pytest -p no:cacheprovider -q -rs "$@" > "$out/$name.log" 2>&1
  echo "== $name: exit $?"; grep -E "max abs diff|passed|failed|error|SKIPPED" "$out/$name.log" | tail -40
}

run 270 gemv tests/benchmarks/test_block_sparse_gpu.py -m benchmark -s
run 120 gpu-tests tests/gpu -m gpu -s
run 100 decode tests/benchmarks/test_triton_decode_gpu.py -m benchmark -s
sed -n '/copy .* GB\/s/,/settings failed/p' "$out/gemv.log"
sed -n '/new tokens/,/ort-cuda/p' "$out/decode.log"
