#!/usr/bin/env bash
# One prepared GPU check (fits in about 9 minutes on one GPU):
#   1. minidnn info;
#   2. the CUDA test suite: every device-parametrized op, gradient and memory test on "cuda",
#      and tests/test_cuda_backend.py (at most 4.5 minutes);
#   3. ResNet-50 (batch 64, 224x224) step times vs PyTorch, unlimited and at 50% and 25% of the
#      liveness peak (scripts/bench_cuda.py, at most 3 minutes);
#   4. an NCCL smoke run: a data-parallel trainer over a communicator of one rank, its gradients
#      all-reduced by NCCL, trains what one process trains (tests/test_nccl.py, at most 1 minute).
# Writes gpu_check.txt (and the benchmark's cuda_bench.{json,txt}) to $OUT if set, else ./gpu_check.
# Run from the repository root with minidnn installed with the cuda extra: pip install -e ".[cuda,dev,mpi]"
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu_check}"
mkdir -p "$out"
report="$out/gpu_check.txt"
: > "$report"
{
    echo "== minidnn info"
    python -m minidnn.cli info 2>&1 || minidnn info 2>&1
    echo
    echo "== CUDA tests"
} | tee -a "$report"
timeout 270 python -m pytest -q --maxfail=20 -p no:cacheprovider -rfs tests/test_cuda_backend.py \
    tests/test_ops.py tests/test_executor.py tests/test_memory_budget.py tests/test_subbatch.py \
    tests/test_torch_agreement.py tests/test_fused_recompute.py tests/test_adaptive_pool.py \
    tests/test_atomic_step.py -k "cuda or test_cuda_backend" 2>&1 | tail -60 | tee -a "$report"
echo "tests exit status: ${PIPESTATUS[0]}" | tee -a "$report"
echo | tee -a "$report"
echo "== ResNet-50 step time" | tee -a "$report"
timeout 180 python scripts/bench_cuda.py --out "$out" 2>&1 | tail -20 | tee -a "$report"
echo "benchmark exit status: ${PIPESTATUS[0]}" | tee -a "$report"
echo | tee -a "$report"
echo "== NCCL smoke (1 GPU, a communicator of size 1)" | tee -a "$report"
timeout 60 python -m pytest -q -p no:cacheprovider -rfs tests/test_nccl.py 2>&1 | tail -20 | tee -a "$report"
echo "nccl exit status: ${PIPESTATUS[0]}" | tee -a "$report"
