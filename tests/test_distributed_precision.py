"""Data-parallel mixed precision: fp32 gradient buckets reduced in fp32, synchronized BatchNorm in fp32,
one loss-scaling decision and one scale on every rank, and ranks of different precisions refused.

The multi-rank cases run tests/dist_worker.py under ``mpiexec -n N`` (N <= 3) with ``--every-rank``: each
rank writes its parameters, BatchNorm statistics, loss and (fp16) loss scale after every step. Every
subprocess has a timeout, so a hang fails.
"""
import os
import subprocess
import sys

import minidnn  # noqa: F401  first (see conftest)
import numpy as np
import pytest
from test_distributed import MPIEXEC, TIMEOUT, WORKER, _env

pytestmark = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec next to the interpreter "
                                "(install the mpi extra)")

U = 2.0 ** -8           # bf16's unit roundoff (half its epsilon 2^-7): a stored value is within U of its fp32 value


def _histories(n, args, out):
    """Each rank's record of every step (``{"<step>/<name>": array}``), in rank order."""
    cmd = ([MPIEXEC, "-n", str(n)] if n > 1 else []) + [sys.executable, WORKER, "--out", str(out),
                                                        "--every-rank", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    histories = []
    for rank in range(n):
        with np.load(f"{out}.rank{rank}.npz") as f:
            histories.append(dict(f))
    return histories


def _assert_ranks_identical(histories):
    """Every rank's parameters, BatchNorm statistics, loss and loss scale equal rank 0's, bit for bit, after
    every step: each rank starts from rank 0's state and updates with the same reduced fp32 gradients."""
    first = histories[0]
    assert first, "no step recorded"
    for rank, h in enumerate(histories[1:], 1):
        assert h.keys() == first.keys()
        for k in first:
            assert np.array_equal(h[k], first[k], equal_nan=True), f"rank {rank}'s {k} differs from rank 0's"


def _steps(history):
    return sorted({int(k.split("/")[0]) for k in history})


def _names(history):
    return sorted({k.split("/", 1)[1] for k in history if k.startswith("0/")})


# -- (a) bf16 and fp16 data-parallel train what one process trains ------------------------------------

@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_two_ranks_are_bitwise_one_process_with_two_sub_batches(precision, tmp_path):
    """Under autocast each rank's convolution and linear gradients come out of the op in the low dtype and
    are cast into the fp32 master gradients; the buckets then add the ranks' fp32 gradients in fp32. One
    process splitting the same global batch into two sub-batches of the ranks' size does the same
    arithmetic: each sub-batch's low-precision gradient cast up and added into the fp32 master gradient
    (the loss weighted 1/2 per sub-batch, as each rank's by its share 1/2; under fp16 seeded with 1/2 of the
    same loss scale, unscaled after the sum). A sum of two fp32 terms is the same bits in either order, so
    both runs, and both ranks, must agree bit for bit after every step. A bucket reduced in bf16/fp16, or a
    gradient unscaled, seeded or averaged otherwise, would not."""
    args = ["--model", "cnn", "--dtype", "float32", "--precision", precision, "--batch", "8", "--steps", "3"]
    ranks = _histories(2, args, tmp_path / "ranks.npz")
    split = _histories(1, args + ["--budget", "0.8", "--sub-batches", "--k", "2"], tmp_path / "split.npz")[0]
    _assert_ranks_identical(ranks)
    assert _steps(split) == [0, 1, 2] and ranks[0].keys() == split.keys()
    for k in split:
        assert np.array_equal(ranks[0][k], split[k]), f"{k}: two ranks differ from one process's two sub-batches"
    assert not np.array_equal(split["2/0.weight"], split["0/0.weight"])      # it trained


# bf16 stored values on the longest path of a gradient of small_bn_cnn (tests/dist_worker.py): forward
# conv, BatchNorm, conv, BatchNorm, linear; backward the linear's, BatchNorms', convolutions' input and
# weight gradients (ReLU and max-pooling only select bf16 values: exact)
ROUNDINGS = 12


@pytest.mark.parametrize("ranks", [2, 3])
def test_bf16_ranks_train_what_one_process_trains_on_the_whole_batch(ranks, tmp_path):
    """With synchronized BatchNorm the ranks are not bit for bit one process on the whole batch: each rank's
    partial weight gradient is rounded to bf16 before the fp32 sum (one process rounds the whole batch's
    once), the global statistics are combined from the ranks' fp32 moments, and fp32 sums run in another
    order. Each such difference is in the last fp32 bits of a value that is then stored in bf16, so it
    moves a stored value by at most one bf16 ulp (2U relative) where its rounding flips. A gradient, a
    product of the ROUNDINGS stored values on its path, differs by at most 2 * ROUNDINGS * U relative (to
    first order), and so does each step's update: after t steps the parameters lie within that fraction
    of the path one process trained (the sum of its steps' lengths); the BatchNorm running statistics and
    the loss, from the forward's values, within it relative to themselves. (Measured on 2 and 3 ranks: the
    parameters within 7.2U of the path, the statistics 1.5U, the loss 0.1U; with per-rank statistics,
    bn="local", the parameters are 45U to 56U away and the statistics 31U to 68U.) Every rank holds the
    same bits."""
    args = ["--model", "cnn-bn", "--dtype", "float32", "--precision", "bf16", "--batch", "12", "--steps", "4"]
    got = _histories(ranks, args, tmp_path / "ranks.npz")
    _assert_ranks_identical(got)
    ref = _histories(1, args, tmp_path / "one.npz")[0]
    assert ref.keys() == got[0].keys()
    from dist_worker import small_bn_cnn
    net = small_bn_cnn()
    net.init_parameters(0)
    params = [name for name, _ in net.named_parameters()]
    stats = [name for name, _ in net.named_buffers() if "running" in name]
    bound = 2 * ROUNDINGS * U

    def flat(h, t, names):
        if t < 0:
            return np.concatenate([np.asarray(p.data, np.float64).ravel() for _, p in net.named_parameters()])
        return np.concatenate([h[f"{t}/{n}"].astype(np.float64).ravel() for n in names])

    path = 0.0
    for t in _steps(ref):
        path += np.linalg.norm(flat(ref, t, params) - flat(ref, t - 1, params))
        d = np.linalg.norm(flat(got[0], t, params) - flat(ref, t, params))
        assert d <= bound * path, f"step {t}: parameters {d / path / U:.2f}U of the path from one process's"
        for n in stats:
            a, b = got[0][f"{t}/{n}"].astype(np.float64), ref[f"{t}/{n}"].astype(np.float64)
            assert np.linalg.norm(a - b) <= bound * np.linalg.norm(b), f"step {t}: {n}"
        assert abs(got[0][f"{t}/loss"] - ref[f"{t}/loss"]) <= bound * abs(ref[f"{t}/loss"]), f"step {t}: loss"
    assert path > 0


# -- (b) the buckets and BatchNorm's collectives are fp32 or wider under mixed precision -----------------

@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_buckets_and_batchnorm_collectives_are_fp32_under_mixed_precision(precision):
    """On one rank (this process), every buffer handed to the gradient reduction is float32 and is the
    persistent region's memory holding the fp32 master gradients; BatchNorm's synchronized statistics and
    sums are taken on fp32 values (the op stages its bf16/fp16 activations in fp32) and cross the ranks in
    float64; nothing the ranks exchange is bf16/fp16, although the activations are."""
    MPI = pytest.importorskip("mpi4py.MPI")
    import minidnn as mdn
    from dist_worker import small_bn_cnn
    from minidnn import nn, optim
    from minidnn.precision import is_low
    from minidnn.schedule import PARAM_GRAD
    net = small_bn_cnn()
    net.init_parameters(0)
    trainer = mdn.compile(net, (8, 3, 8, 8), nn.CrossEntropyLoss(), optim.SGD(lr=0.1, momentum=0.9),
                          precision=precision,
                          parallel=mdn.distributed.DataParallel(MPI.COMM_WORLD, bucket_bytes=1024, tail_bytes=512))
    replica = trainer.parallel
    try:
        reduced, exchanged, bn_args = [], [], []
        reduce = replica.reducer.reduce
        replica.reducer.reduce = lambda buf: (reduced.append(buf), reduce(buf))[1]
        for name in ("allreduce", "allgather"):
            def recording(*bufs, _call=getattr(replica.comm, name)):
                exchanged.extend(np.dtype(b.dtype) for b in bufs)
                return _call(*bufs)
            setattr(replica.comm, name, recording)
        statistics, backward = replica.bn.statistics, replica.bn.backward

        def record_statistics(mean, var, count):
            bn_args.append(("statistics", mean.dtype, var.dtype))
            return statistics(mean, var, count)

        def record_backward(k, x, gy, gamma, mean, invstd, gx, ggamma, gbeta):
            bn_args.append(("backward", x.dtype, gy.dtype, gx.dtype, mean.dtype, invstd.dtype))
            return backward(k, x, gy, gamma, mean, invstd, gx, ggamma, gbeta)
        replica.bn.statistics, replica.bn.backward = record_statistics, record_backward

        rng = np.random.default_rng(0)
        for _ in range(2):
            trainer.step(rng.standard_normal((8, 3, 8, 8)), rng.integers(0, 10, 8))
    finally:
        replica.close()

    schedule = trainer.plan.schedule
    low = np.dtype(trainer.precision.low)
    assert any(np.dtype(t.spec.dtype) == low for t in schedule.tensors)           # the activations are low
    # the buckets: every one reduced each step, each a float32 buffer of the region's master gradients
    buckets = replica.reducer.buckets
    assert len(buckets) > 2 and len(reduced) == 2 * len(buckets)
    assert all(b.dtype == np.float32 for b in reduced)
    grads = [p.grad for p in net.parameters()]
    assert all(g.dtype == np.float32 for g in grads)
    for g in grads:
        assert sum(np.shares_memory(g, b) for b in reduced[:len(buckets)]) == 1     # in exactly one bucket
    grad_bytes = sum(t.nbytes for t in schedule.tensors if t.category == PARAM_GRAD)
    assert grad_bytes <= sum(b.nbytes for b in reduced[:len(buckets)])
    # BatchNorm: two layers, statistics in each forward and sums in each backward, on fp32 arrays only
    assert len(bn_args) == 2 * 2 * 2
    assert all(dt == np.float32 for entry in bn_args for dt in entry[1:]), bn_args
    # what crossed the ranks besides the buckets: BatchNorm's float64 statistics and sums, the step's counts
    # (int64), its loss (float64) and, under fp16, the loss scaler's inf/NaN flag (int64)
    assert exchanged and not any(is_low(dt) for dt in exchanged)
    assert np.dtype(np.float64) in exchanged
    assert set(exchanged) <= {np.dtype(np.float64), np.dtype(np.int64)}


# -- (c) fp16: a step skipped on one rank is skipped on every rank; one scale ---------------------------

def gradscaler_scales(overflows, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2):
    """(scale, skipped steps) after each step under torch's GradScaler.update rules, where ``overflows[t]``
    says whether step t's gradients had an inf/NaN."""
    scale, tracker, skipped, out = init_scale, 0, 0, []
    for inf in overflows:
        if inf:
            scale, tracker, skipped = scale * backoff_factor, 0, skipped + 1
        else:
            tracker += 1
            if tracker == growth_interval:
                scale, tracker = scale * growth_factor, 0
        out.append((scale, skipped))
    return out


@pytest.mark.parametrize("how", ["--overflow-rank", "--flag-rank"])
def test_fp16_step_skipped_on_one_rank_is_skipped_on_every_rank(how, tmp_path):
    """Step 2 overflows on rank 1 only: its input slice times 1e6 overflows fp16 (inf/NaN activations, loss
    and gradients), or (--flag-rank) its own check finds inf/NaN while every gradient stays finite, so only
    the ranks' agreement on the flag can make rank 0 skip too. Every rank skips that step (its parameters
    are those of step 1, bit for bit), and every rank's loss scale follows GradScaler's rules from rank 0's
    initial scale (each rank's scaler starts elsewhere: 2^(16 - rank); growth every 2 clean steps)."""
    args = ["--model", "cnn", "--dtype", "float32", "--precision", "fp16", "--batch", "8", "--steps", "5",
            "--growth-interval", "2", "--skew-scale", how, "1", "--overflow-step", "2"]
    ranks = _histories(2, args, tmp_path / "ranks.npz")
    _assert_ranks_identical(ranks)
    h = ranks[0]
    expected = gradscaler_scales([t == 2 for t in range(5)])
    assert [(float(h[f"{t}/scale"]), int(h[f"{t}/skipped"])) for t in range(5)] == expected
    params = [n for n in _names(h) if n not in ("loss", "scale", "skipped")]
    for n in params:
        assert np.array_equal(h[f"2/{n}"], h[f"1/{n}"]), f"step 2 updated {n}"
    for t in (1, 3, 4):                  # the other steps trained
        assert any(not np.array_equal(h[f"{t}/{n}"], h[f"{t - 1}/{n}"]) for n in params), f"step {t} skipped"
    assert all(np.isfinite(h[f"{t}/loss"]) for t in (0, 1, 3, 4))


# -- (d) ranks of different precisions are refused, naming it -------------------------------------------

def test_ranks_compiled_in_different_precisions_are_refused_naming_it(tmp_path):
    out = str(tmp_path / "x.npz")
    worker = [sys.executable, WORKER, "--out", out, "--dtype", "float32"]
    cmd = [MPIEXEC, "-n", "2", *worker, "--precision", "bf16", ":", "-n", "1", *worker, "--precision", "fp16"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=_env())
    assert r.returncode != 0
    assert "rank 2's precision differs from rank 0's: fp16 != bf16" in r.stderr, r.stderr[-3000:]


def test_minidnn_train_ranks_with_different_precisions_are_refused_naming_it(tmp_path):
    train = [sys.executable, "-m", "minidnn.cli", "train", "--model", "lenet5", "--epochs", "1", "--no-progress",
             "--out", str(tmp_path / "run")]
    cmd = [MPIEXEC, "-n", "1", *train, "--precision", "bf16", ":", "-n", "1", *train, "--precision", "fp16"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=_env(), cwd=tmp_path)
    assert r.returncode != 0
    assert "rank 1's --precision differs from rank 0's: fp16 != bf16" in r.stderr, r.stderr[-3000:]
    assert not os.path.exists(tmp_path / "run" / "steps.jsonl")      # refused before a step
