#!/usr/bin/env bash
# The companion of scripts/gpu_check.sh, run on a machine that reaches PyPI: downloads into DIR
# (default wheels/, ignored by git) every wheel the GPU machine lacks, for CPython 3.12 on manylinux
# x86-64, so that gpu_check.sh installs offline there.
#
# The GPU machine has Python 3.12, CuPy 14 for CUDA 13, nvidia-cudnn-cu13, nvidia-nccl-cu13, PyTorch,
# pybind11, scikit-build-core, CMake and mpi4py, and no registry. What it lacks: minidnn's other
# dependencies, the dev extra's test tools (highspy among them), pytest-timeout (gpu_check.sh's
# per-test limit), and an MPI library (the mpich wheel, for mpi4py). Their dependencies come too
# (pip resolves them for the target, binary wheels only); what the machine has already is skipped
# there when installing, so a wheel downloaded twice costs only disk.
#
#   scripts/gpu_wheels.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-wheels}"
mkdir -p "$dir"
# The project's own requirements, read from pyproject.toml (its dependencies, the dev and mpi extras)
# so that this list cannot fall behind it; mpi4py is on the GPU machine already.
mapfile -t reqs < <(python3 - <<'EOF'
import re
import tomllib
with open("pyproject.toml", "rb") as f:
    p = tomllib.load(f)["project"]
reqs = p["dependencies"] + p["optional-dependencies"]["dev"] + p["optional-dependencies"]["mpi"]
for r in reqs:
    if re.match(r"mpi4py\b", r) is None:
        print(r)
EOF
)
reqs+=("pytest-timeout>=2")
echo "gpu_wheels: downloading for cp312 manylinux x86_64 into $dir: ${reqs[*]}"
python3 -m pip download --quiet --dest "$dir" --only-binary=:all: --implementation cp --python-version 3.12 \
    --abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform linux_x86_64 "${reqs[@]}"
printf '%s\n' "${reqs[@]}" > "$dir/requirements.txt"
echo "gpu_wheels: $(ls "$dir"/*.whl | wc -l) wheels in $dir ($(du -sh "$dir" | cut -f1)); requirements in $dir/requirements.txt"
