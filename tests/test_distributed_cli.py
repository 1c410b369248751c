"""``minidnn train`` under mpiexec: ranks that would train different things are refused before training,
naming the difference and the ranks; a last batch smaller than the ranks is trained as one process trains
it; a stopped rank is named on the launcher's terminal within a minute.

Every subprocess has a timeout, so a hang fails.
"""
import json
import os
import signal
import struct
import subprocess
import sys
import time

import minidnn  # noqa: F401  first (see conftest)
import numpy as np
import pytest
from test_distributed import MPIEXEC, NAMED_WITHIN_SECONDS, TIMEOUT, _env, seconds_to_end

pytestmark = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec next to the interpreter "
                                "(install the mpi extra)")


def write_mnist(root, n, seed):
    """MNIST IDX files of ``n`` training and ``n // 2`` test images (28x28, ten classes) drawn from ``seed``."""
    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    for prefix, count in (("train", n), ("t10k", n // 2)):
        for name, array in ((f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (count, 28, 28), np.uint8)),
                            (f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, count, np.uint8))):
            header = bytes([0, 0, 8, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
            with open(os.path.join(root, name), "wb") as f:
                f.write(header + array.tobytes())
    return f"mnist:{root}"


def _train(out, *extra):
    return [sys.executable, "-m", "minidnn.cli", "train", "--model", "lenet5", "--no-progress", "--out", str(out),
            *extra]


def _run(cmd, cwd):
    # not from the source tree: -m would import its minidnn rather than the installed one
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=_env(), cwd=cwd)


def test_ranks_that_would_train_differently_are_refused_naming_what_and_whom(tmp_path):
    """Seed, augmentation, padding, schedule, epochs, learning rate, momentum and the data itself: each
    changes what is trained, so each is compared, and the first is named with every rank that differs."""
    data = write_mnist(tmp_path / "a", 16, seed=0)
    other = write_mnist(tmp_path / "b", 16, seed=1)        # the same layout, other images
    out = tmp_path / "run"
    base = ["--batch-size", "8", "--epochs", "1", "--seed", "0", "--augment", "crop", "--pad", "2",
            "--schedule", "cosine", "--lr", "0.05"]
    ranks = [_train(out, "--data", data, *base),
             _train(out, "--data", other, "--batch-size", "8", "--epochs", "2", "--seed", "1", "--augment", "none",
                    "--pad", "3", "--schedule", "step", "--lr", "0.1", "--momentum", "0.5"),
             _train(out, "--data", data, *base[:2], "--epochs", "3", *base[4:])]
    cmd = [MPIEXEC]
    for i, rank in enumerate(ranks):
        cmd += ([":"] if i else []) + ["-n", "1", *rank]
    r = _run(cmd, tmp_path)
    assert r.returncode != 0
    # every rank says it; the launcher may interleave their lines
    assert "rank 1's --epochs differs from rank 0's: 2 != 1 (and rank 2's: 3); also different: " in r.stderr, \
        r.stderr[-3000:]
    also = r.stderr.split("also different: ")[1]
    for name in ("--seed", "--augment", "--pad", "--schedule", "--lr", "--momentum", "training data", "test data"):
        assert name in also, (name, r.stderr[-3000:])
    assert not (out / "steps.jsonl").exists()              # refused before the first step


def test_ranks_reading_other_data_of_the_same_layout_are_refused(tmp_path):
    data = write_mnist(tmp_path / "a", 16, seed=0)
    other = write_mnist(tmp_path / "b", 16, seed=1)
    out = tmp_path / "run"
    cmd = [MPIEXEC, "-n", "1", *_train(out, "--data", data, "--epochs", "1", "--batch-size", "8"), ":",
           "-n", "1", *_train(out, "--data", other, "--epochs", "1", "--batch-size", "8")]
    r = _run(cmd, tmp_path)
    assert r.returncode != 0
    assert "rank 1's training data differs from rank 0's: 16 images of 1x28x28, 10 classes, crc32" in r.stderr, \
        r.stderr[-3000:]
    assert not (out / "steps.jsonl").exists()


def test_a_last_batch_smaller_than_the_ranks_is_trained_as_one_process_trains_it(tmp_path):
    """34 images in batches of 16: a last batch of 2 over 3 ranks leaves rank 2 none; it takes part with
    nothing to add, and the run has one process's steps, losses and weights."""
    from minidnn.checkpoint import load_checkpoint
    data = write_mnist(tmp_path / "data", 34, seed=0)
    args = ["--data", data, "--epochs", "2", "--batch-size", "16"]
    runs = {}
    for n in (1, 3):
        out = tmp_path / f"ranks{n}"
        r = _run(([MPIEXEC, "-n", str(n)] if n > 1 else []) + _train(out, *args), tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        steps = [json.loads(ln) for ln in open(out / "steps.jsonl")]
        runs[n] = steps, load_checkpoint(str(out / "checkpoint.safetensors"))[0]
    (one, a), (many, b) = runs[1], runs[3]
    assert [(s["epoch"], s["batch"]) for s in many] == [(s["epoch"], s["batch"]) for s in one]
    assert len(one) == 2 * 3
    # float32: the ranks sum their shares of the gradients in another order than one process does
    np.testing.assert_allclose([s["loss"] for s in many], [s["loss"] for s in one], rtol=1e-5)
    for k in a:
        assert np.linalg.norm(b[k] - a[k]) <= 1e-5 * np.linalg.norm(a[k]), k


def test_a_stopped_rank_is_named_on_the_terminal_within_a_minute(tmp_path):
    """ResNet-20 with synchronized BatchNorm (most of a step waits in its collectives), rank 2 stopped:
    the launcher's own output names it, as ``minidnn: error: ...``, within a minute."""
    out = tmp_path / "run"
    log_path = tmp_path / "log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([MPIEXEC, "-n", "3", *_train(out, "--model", "resnet20", "--data",
                                                             "synthetic:3x16x16:n=4000", "--batch-size", "12",
                                                             "--epochs", "1000")],
                                stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=tmp_path)
    pid = None
    try:
        t0 = time.monotonic()
        while not (out / "steps.jsonl").exists() or not open(out / "steps.jsonl").read().strip():
            assert proc.poll() is None, open(log_path).read()[-3000:]
            assert time.monotonic() - t0 < TIMEOUT, "no step was logged"
            time.sleep(0.2)
        line = next(ln for ln in open(log_path) if "data-parallel over 3 ranks" in ln)
        pid = int(line.split("rank 2: pid ")[1].split()[0])
        os.kill(pid, signal.SIGSTOP)
        seconds = seconds_to_end(proc)
    finally:
        if proc.poll() is None:            # the launcher did not end the job: end it, the stopped rank too
            proc.kill()
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
    terminal = open(log_path).read()
    assert proc.returncode != 0
    assert "minidnn: error: " in terminal and "rank 2 stopped responding" in terminal, terminal[-3000:]
    assert seconds < NAMED_WITHIN_SECONDS
