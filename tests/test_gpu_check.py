"""scripts/gpu_check.sh --dry-run: the GPU check's every step but the GPU parts, offline, in seconds.
The CUDA tests' collection counts the bf16/fp16 cases apart; the benchmark parses the precisions it is run with.

Without the wheel folder (scripts/gpu_wheels.sh downloads it, which needs PyPI) the offline install
is reported as not checked; the rest - minidnn info, the CUDA tests' and the NCCL test's collection,
the benchmark's options, the step limits against the 8 minutes - runs as on the GPU machine.
"""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(sys.platform != "linux", reason="the GPU check is a Linux shell script")
def test_gpu_check_dry_run(tmp_path):
    logs = tmp_path / "logs"
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--dry-run",
                        "--wheels", str(tmp_path / "no-wheels"), str(logs)],
                       env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=120)
    summary = (logs / "summary.txt").read_text()
    logged = "".join(f"\n--- {log.name}\n{log.read_text()[-3000:]}" for log in sorted(logs.glob("*.log")))
    assert r.returncode == 0, r.stdout + r.stderr + logged
    assert "= 480 s" in summary and "the offline install is not checked" in summary
    for step in ("info", "tests", "benchmark", "nccl"):
        assert f"== {step}: exit 0" in summary, step
        assert (logs / f"{step}.log").stat().st_size > 0
    assert "test_cuda_backend.py" in (logs / "tests.log").read_text()
    # the bf16 and fp16 cases are selected beside fp32's (the ops in 2-byte types, mixed-precision steps)
    mixed = re.search(r"bf16/fp16 CUDA tests among them: (\d+)", summary)
    assert mixed and int(mixed.group(1)) >= 4, summary
    assert "dry run done" in summary
    # the steps ran the installed minidnn, never the source tree that `python -m` puts first on sys.path
    assert "ImportError" not in (logs / "tests.log").read_text()
