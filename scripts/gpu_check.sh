#!/usr/bin/env bash
# The first run on a GPU, for a bare machine that reaches no package registry (one GPU, CUDA 13
# driver, Python 3.12 with CuPy, the cuDNN and NCCL wheels, PyTorch, pybind11, scikit-build-core,
# CMake and mpi4py installed; see docs/cuda.md). At most 8 minutes on 16 cores, the build included:
#
#   1. install, offline: the wheels scripts/gpu_wheels.sh downloaded on a machine that reaches PyPI
#      (pip --no-index from that folder; what is installed already stays), then minidnn itself,
#      editable, with its C++ and cuDNN modules (--no-index --no-deps --no-build-isolation, no LTO,
#      every core; a missing cuDNN piece fails the build)                       at most 25 s + 70 s
#   2. minidnn info: stops here unless the cuda backend is available           at most 10 s
#   3. the CUDA tests: every test whose name says cuda (the device-parametrized op, gradient and
#      memory tests on "cuda", tests/test_cuda_*.py: bf16 and fp16 beside fp32, each op the backend
#      runs natively in a 2-byte type against its fp32 result and a mixed-precision step against
#      the CPU backend's), 60 s per test                                       at most 180 s
#   4. ResNet-50 at batch 64: minidnn unlimited and at 50% of its liveness peak, in fp32, bf16,
#      fp16 and TF32 (in that order: the deadline cuts the last), against PyTorch (autocast and
#      GradScaler for bf16/fp16); predicted vs measured ms, plan peak vs cudaMemGetInfo and CuPy's
#      pool (scripts/bench_cuda.py)                                            at most 150 s
#   5. NCCL smoke: a data-parallel trainer over a communicator of one rank trains what one process
#      trains (tests/test_nccl.py)                                             at most 45 s
#
# Each step's full output goes to its own log in LOGDIR (written as it runs: a step its timeout
# stops keeps its log); a summary with each step's status and the end of each log follows.
#
#   scripts/gpu_check.sh [--dry-run] [--wheels DIR] LOGDIR
#
# --dry-run does everything but the GPU parts: pip resolves the install from the wheel folder
# without installing (skipped, and said so, when the folder is absent), minidnn info runs without
# stopping, the CUDA tests (the bf16/fp16 ones counted apart) and the NCCL test are collected, the
# benchmark's options are read, and the step limits are checked against the 8 minutes. CI runs it
# (tests/test_gpu_check.py).
set -uo pipefail
cd "$(dirname "$0")/.."
dry=0
wheels=wheels
logdir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry=1 ;;
        --wheels) wheels="$2"; shift ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
        *) logdir="$1" ;;
    esac
    shift
done
if [ -z "$logdir" ]; then
    echo "usage: scripts/gpu_check.sh [--dry-run] [--wheels DIR] LOGDIR" >&2
    exit 2
fi
mkdir -p "$logdir"
py="${PYTHON:-python3}"
# -P: the installed minidnn is what runs; `python -m` would otherwise put the source tree first on
# sys.path, whose minidnn has neither the built extension nor the packaged model zoo.
pym=("$py" -P -m)
summary="$logdir/summary.txt"
: > "$summary"

# Step limits in seconds; their sum is the whole check's limit.
T_DEPS=25 T_BUILD=70 T_INFO=10 T_TESTS=180 T_BENCH=150 T_NCCL=45
# the benchmark starts no configuration past 120 s, so that it writes its report within its limit
bench=(scripts/bench_cuda.py --precisions fp32,bf16,fp16,tf32 --budgets none,0.5 --steps 5 --warmup 2 --deadline 120)
total=$((T_DEPS + T_BUILD + T_INFO + T_TESTS + T_BENCH + T_NCCL))

note() { echo "$*" | tee -a "$summary"; }

# step NAME LIMIT COMMAND...: runs COMMAND under LIMIT seconds, its output into LOGDIR/NAME.log
step() {
    local name="$1" limit="$2"
    shift 2
    local t0=$SECONDS rc
    timeout -k 5 "$limit" "$@" > "$logdir/$name.log" 2>&1
    rc=$?
    local how="exit $rc"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && how="stopped at its limit of $limit s"
    note "== $name: $how after $((SECONDS - t0)) s (log: $logdir/$name.log)"
    tail -n 25 "$logdir/$name.log" | sed 's/^/   /' | tee -a "$summary" > /dev/null
    return $rc
}

note "gpu_check $(date -u +%FT%TZ) $([ $dry = 1 ] && echo '(dry run)') on $(hostname): $(nproc) cores; $($py --version 2>&1)"
if [ $total -gt 480 ]; then
    note "the step limits add up to $total s, more than 8 minutes"
    exit 1
fi
note "step limits: deps $T_DEPS s, build $T_BUILD s, info $T_INFO s, tests $T_TESTS s, benchmark $T_BENCH s, nccl $T_NCCL s = $total s"

# 1. install, offline
pipx=("${pym[@]}" pip install --no-index --disable-pip-version-check)
if [ -f "$wheels/requirements.txt" ]; then
    if [ $dry = 1 ]; then
        # resolved for the GPU machine's interpreter (CPython 3.12, manylinux x86-64), whatever runs this
        step deps "$T_DEPS" "${pipx[@]}" --dry-run --ignore-installed --only-binary=:all: --python-version 3.12 \
            --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
            --platform manylinux_2_17_x86_64 --platform linux_x86_64 \
            --find-links "$wheels" -r "$wheels/requirements.txt" \
            || { note "gpu_check: the wheel folder $wheels does not hold what the install needs"; exit 1; }
    else
        step deps "$T_DEPS" "${pipx[@]}" --find-links "$wheels" -r "$wheels/requirements.txt" \
            || { note "gpu_check: the offline install of the dependencies failed"; exit 1; }
    fi
elif [ $dry = 1 ]; then
    note "== deps: no wheel folder $wheels/ (scripts/gpu_wheels.sh fills it): the offline install is not checked"
else
    note "gpu_check: no wheel folder $wheels/: run scripts/gpu_wheels.sh on a machine that reaches PyPI and copy $wheels/ here"
    exit 1
fi
if [ $dry = 1 ]; then
    note "== build: skipped in a dry run (CI builds minidnn, with the cuDNN binding where CUDA's headers are)"
else
    export CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
    step build "$T_BUILD" "${pipx[@]}" --no-deps --no-build-isolation -e . \
        --config-settings=cmake.define.MINIDNN_CUDNN=ON \
        --config-settings=cmake.define.CMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF \
        || { note "gpu_check: minidnn does not build"; exit 1; }
fi

# 2. is CUDA usable?
step info "$T_INFO" "${pym[@]}" minidnn.cli info
if ! grep -q "cuda backend: available" "$logdir/info.log"; then
    if [ $dry = 0 ]; then
        note "gpu_check: the cuda backend is not available (see info.log): stopping before the GPU steps"
        exit 1
    fi
    note "   (dry run: the cuda backend is not available here, as expected without a GPU)"
fi

# 3-5. the GPU steps, or in a dry run what can be checked of them without a GPU
if [ $dry = 1 ]; then
    step tests "$T_TESTS" "${pym[@]}" pytest -q -p no:cacheprovider --collect-only -k cuda tests/ \
        || { note "gpu_check: the CUDA tests do not collect"; exit 1; }
    grep -Eq "^tests/.*: [1-9][0-9]*$" "$logdir/tests.log" || { note "gpu_check: no CUDA test selected"; exit 1; }
    mixed=$("${pym[@]}" pytest -q -p no:cacheprovider --collect-only -k "cuda and (bf16 or fp16)" tests/ 2>&1 \
            | awk -F': ' '/^tests\/.*: [0-9]+$/ {n += $2} END {print n + 0}')
    note "   bf16/fp16 CUDA tests among them: $mixed"
    [ "$mixed" -gt 0 ] || { note "gpu_check: no bf16/fp16 CUDA test selected"; exit 1; }
    # --help after the options: they are parsed (an unknown precision fails here) before the help
    step benchmark "$T_BENCH" "$py" "${bench[@]}" --help || exit 1
    step nccl "$T_NCCL" "${pym[@]}" pytest -q -p no:cacheprovider --collect-only tests/test_nccl.py || exit 1
    note "gpu_check: dry run done"
    exit 0
fi
failed=0
step tests "$T_TESTS" "${pym[@]}" pytest -q -p no:cacheprovider -rfs --timeout=60 -k cuda tests/ || failed=1
step benchmark "$T_BENCH" "$py" "${bench[@]}" --out "$logdir" || failed=1
step nccl "$T_NCCL" "${pym[@]}" pytest -q -p no:cacheprovider -rfs --timeout=40 tests/test_nccl.py || failed=1
note "gpu_check: done$([ $failed = 1 ] && echo ', with failures')"
exit $failed
