"""Data-parallel training under mpiexec gives one process's parameters; a failed rank stops the others.

Each case runs tests/dist_worker.py alone and under ``mpiexec -n N`` (N = 2, 3) and compares the
parameters and BatchNorm statistics after the steps. Every subprocess has a timeout, so a hang fails.
"""
import glob
import os
import signal
import subprocess
import sys
import time

import minidnn  # noqa: F401  first (see conftest)
import numpy as np
import pytest

WORKER = os.path.join(os.path.dirname(__file__), "dist_worker.py")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
TIMEOUT = 600          # seconds a run may take on a loaded 2-core machine before the test fails

pytestmark = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec next to the interpreter "
                                "(install the mpi extra)")


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def _run(n, args, out, timeout=TIMEOUT):
    cmd = ([MPIEXEC, "-n", str(n)] if n > 1 else []) + [sys.executable, WORKER, "--out", str(out), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    with np.load(str(out)) as f:
        return dict(f)


_reference = {}


def _single(args, tmp_path):
    key = tuple(args)
    if key not in _reference:
        _reference[key] = _run(1, args, tmp_path / "single.npz")
    return _reference[key]


def _assert_same(ref, got, rtol, atol):
    """Every parameter, buffer and loss within ``rtol`` (relative) or ``atol``."""
    assert ref.keys() == got.keys()
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=rtol, atol=atol, err_msg=k)


CASES = {
    "cnn-f64": ["--model", "cnn", "--dtype", "float64"],
    # float32 at a tenth of the learning rate: at 0.1 with momentum, ResNet-20 at a batch of 6 magnifies
    # rounding so much that one float32 process is itself 1e-3 (normwise) from float64 after 3 steps
    "cnn-f32": ["--model", "cnn", "--dtype", "float32", "--lr", "0.01"],
    "cnn-sub-batches": ["--model", "cnn", "--dtype", "float64", "--budget", "0.8", "--sub-batches",
                        "--batch", "12"],
    "cnn-last-batch": ["--model", "cnn", "--dtype", "float64", "--last-batch", "5"],
    # a last batch of one sample: the other ranks have none, and still take part with no weight (their
    # synchronized BatchNorm counts nothing and gives their stand-in sample no gradient)
    "resnet20-last-batch-1": ["--model", "resnet20", "--dtype", "float64", "--last-batch", "1"],
    "resnet20-f64": ["--model", "resnet20", "--dtype", "float64"],
    "resnet20-f32": ["--model", "resnet20", "--dtype", "float32", "--lr", "0.01"],
    "resnet20-budget": ["--model", "resnet20", "--dtype", "float64", "--budget", "0.8"],
    # BatchNorms recomputed in the backward: their statistics gathered again, in the same order on every rank
    "resnet20-recompute": ["--model", "resnet20", "--dtype", "float64", "--budget", "0.8", "--policy", "recompute"],
}


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_ranks_train_what_one_process_trains(case, ranks, tmp_path):
    args = CASES[case]
    ref = _single(args, tmp_path)
    got = _run(ranks, args, tmp_path / f"ranks{ranks}.npz")
    if "float64" in args:
        _assert_same(ref, got, 1e-12, 1e-12)
        return
    # float32: each tensor within 1e-5 of one process's, relative to its norm (near-zero elements,
    # such as BatchNorm's biases after 3 steps, have no meaningful elementwise relative error)
    assert ref.keys() == got.keys()
    for k in ref:
        d, r = np.linalg.norm((got[k] - ref[k]).ravel()), np.linalg.norm(ref[k].ravel())
        assert d <= 1e-5 * r, (k, d, r)


def test_per_rank_batchnorm_is_not_the_global_batch(tmp_path):
    """The opt-in per-rank statistics train something else: the synchronized ones are what makes
    ResNet-20 agree."""
    args = ["--model", "resnet20", "--dtype", "float64", "--steps", "2"]
    ref = _single(args, tmp_path)
    local = _run(2, args + ["--bn", "local"], tmp_path / "local.npz")
    diff = max(float(np.abs(local[k] - ref[k]).max()) for k in ref)
    assert diff > 1e-6


def test_a_configuration_that_differs_is_refused_naming_it(tmp_path):
    out = str(tmp_path / "x.npz")
    cmd = [MPIEXEC, "-n", "1", sys.executable, WORKER, "--out", out, "--batch", "6", ":",
           "-n", "1", sys.executable, WORKER, "--out", out, "--batch", "8"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=_env())
    assert r.returncode != 0
    assert "rank 1's global batch differs from rank 0's: [8, 3, 8, 8] != [6, 3, 8, 8]" in r.stderr


def test_a_compile_seed_or_normalization_that_differs_is_refused_naming_it(tmp_path):
    """compile's seed (dropout's and the step's random stream) and the input normalization change what
    is trained: refused at compile time, naming them and the rank."""
    out = str(tmp_path / "x.npz")
    cmd = [MPIEXEC, "-n", "1", sys.executable, WORKER, "--out", out, ":",
           "-n", "1", sys.executable, WORKER, "--out", out, "--seed", "1", "--normalize", "0.5,2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=_env())
    assert r.returncode != 0
    assert "rank 1's random stream (compile's seed) differs from rank 0's" in r.stderr, r.stderr[-3000:]
    assert "also different: input normalization" in r.stderr, r.stderr[-3000:]


def _wait_for(path, proc, log, timeout=TIMEOUT):
    """The text of ``path`` once ``proc`` has written it; fails at once if ``proc`` ended first."""
    t0 = time.monotonic()
    while not os.path.exists(path) or not open(path).read().strip():
        assert proc.poll() is None, f"the run ended before writing {path}:\n{open(log).read()[-3000:]}"
        assert time.monotonic() - t0 < timeout, f"{path} never appeared"
        time.sleep(0.2)
    return open(path).read().strip()


def _long_run(tmp_path, *extra):
    out = tmp_path / "long.npz"
    log = open(tmp_path / "log", "w")
    proc = subprocess.Popen([MPIEXEC, "-n", "3", sys.executable, WORKER, "--out", str(out), "--steps", "1000000",
                             "--timeout", "10", *extra], stdout=log, stderr=subprocess.STDOUT, env=_env())
    _wait_for(f"{out}.steps", proc, tmp_path / "log")
    return proc, out, tmp_path / "log"


def _ended(proc, log, within=60):
    t0 = time.monotonic()
    try:
        proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the other ranks did not stop within {within} s")
    assert proc.returncode != 0
    errors = sorted(glob.glob(os.path.join(os.path.dirname(log), "*.error")))   # the workers' own words
    return open(log).read() + "".join(open(p).read() + "\n" for p in errors), time.monotonic() - t0


def test_kill_9_of_a_rank_ends_the_others_naming_it(tmp_path):
    ckpt = tmp_path / "run"
    log_path = tmp_path / "log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, "-m", "minidnn.cli", "train", "--model", "lenet5",
                                 "--epochs", "1000", "--batch-size", "16", "--out", str(ckpt), "--no-progress"],
                                stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=tmp_path)
    _wait_for(ckpt / "steps.jsonl", proc, log_path)
    line = next(ln for ln in open(log_path) if "data-parallel over 2 ranks" in ln)
    pid = int(line.split("rank 1: pid ")[1].split()[0])
    os.kill(pid, signal.SIGKILL)
    text, seconds = _ended(proc, log_path)
    # the launcher reports the failed process by pid, which the start-up line gives as rank 1's
    assert f"PID {pid}" in text and "Killed (signal 9)" in text, text[-2000:]


def test_a_stopped_rank_is_named_within_the_timeout(tmp_path):
    proc, out, log = _long_run(tmp_path)
    os.kill(int(_wait_for(f"{out}.rank2.pid", proc, log)), signal.SIGSTOP)
    text, seconds = _ended(proc, log)
    assert "rank 2 stopped responding" in text, text[-2000:]


# the promise: a dead or stopped rank is named within this long, whatever it was doing (the default
# timeout of 30 s names a silent rank after 15 s without a heartbeat, plus one beat)
NAMED_WITHIN_SECONDS = 60


def seconds_to_end(proc):
    """Seconds the launcher ``proc`` takes to end once a rank is stopped; the test fails if it has not
    ended within NAMED_WITHIN_SECONDS."""
    t0 = time.monotonic()
    try:
        proc.wait(timeout=NAMED_WITHIN_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the other ranks did not stop within {NAMED_WITHIN_SECONDS} s")
    return time.monotonic() - t0


def test_a_rank_stopped_inside_a_batchnorm_collective_is_named_on_the_terminal(tmp_path):
    """With the default timeout, the other ranks waiting inside a synchronized BatchNorm collective name
    the stopped rank in the launcher's own output (not only in the workers' files) within a minute."""
    out = tmp_path / "bn.npz"
    log_path = tmp_path / "log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([MPIEXEC, "-n", "3", sys.executable, WORKER, "--out", str(out), "--model",
                                 "resnet20", "--steps", "3", "--stop-rank", "2"],
                                stdout=log, stderr=subprocess.STDOUT, env=_env())
    try:
        _wait_for(f"{out}.steps", proc, log_path)          # step 1 done: step 2 stops rank 2
        seconds = seconds_to_end(proc)
    finally:
        if proc.poll() is None:             # the launcher did not end the job: end it, the stopped rank too
            proc.kill()
            _kill(f"{out}.rank2.pid")
    terminal = open(log_path).read()
    assert proc.returncode != 0
    assert "rank 2 stopped responding" in terminal, terminal[-3000:]
    assert "did not finish within" not in terminal, terminal[-3000:]
    assert seconds < NAMED_WITHIN_SECONDS


def _kill(pid_path):
    """SIGKILL the process whose pid is in ``pid_path`` (a stopped rank the launcher has not ended)."""
    try:
        os.kill(int(open(pid_path).read()), signal.SIGKILL)
    except (OSError, ValueError):
        pass


def test_a_hung_rank_is_named_within_the_timeout(tmp_path):
    proc, out, log = _long_run(tmp_path, "--hang-rank", "1")
    text, seconds = _ended(proc, log)
    assert "rank 1 (at collective" in text and "has not reached it: hung" in text, text[-2000:]


def test_each_rank_traces_its_reductions_in_their_own_lane(tmp_path):
    from minidnn.trace import load, problems, stats, summary
    _run(2, ["--model", "resnet20", "--dtype", "float32", "--steps", "2", "--trace", str(tmp_path)],
         tmp_path / "t.npz")
    for rank in range(2):
        trace = load(str(tmp_path / f"rank{rank}.json"))
        assert problems(trace) == []
        comm = [s for s in trace.spans if s.stream == "comm" and s.name.startswith("all-reduce bucket")]
        backward = [s for s in trace.spans if s.kind == "backward"]
        assert comm and all(s.kind == "allreduce" and s.nbytes > 0 for s in comm)
        # ResNet-20's 21 BatchNorms: statistics in the forward, the two sums in the backward
        bn = [s for s in trace.spans if s.stream == "comm" and s.name.startswith("BatchNorm")]
        assert len(bn) == 2 * 21
        # the buckets reduced add up to every gradient, and the first starts while the backward runs
        grads = sum(n for _, c, n in trace.persistent if c == "gradient")
        assert sum(s.nbytes for s in comm) == grads
        assert min(s.start for s in comm) < max(s.end for s in backward)
        st = stats(trace)
        assert 0 <= st["exposed_comm_seconds"] <= st["seconds"]
        assert "exposed communication" in summary(trace)


def _train(n, out, *extra):
    cmd = ([MPIEXEC, "-n", str(n)] if n > 1 else []) + [
        sys.executable, "-m", "minidnn.cli", "train", "--model", "lenet5", "--batch-size", "32", "--no-progress",
        "--augment", "crop", "--out", str(out), *extra]
    # not from the source tree: -m would import its minidnn rather than the installed one
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=_env(), cwd=os.path.dirname(out))
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_a_run_resumed_with_another_number_of_ranks_continues_the_same_training(tmp_path):
    import json

    from minidnn.checkpoint import load_checkpoint
    _train(1, tmp_path / "one", "--epochs", "2")
    _train(2, tmp_path / "many", "--epochs", "1")
    out = _train(3, tmp_path / "many", "--epochs", "2", "--resume", str(tmp_path / "many" / "checkpoint.safetensors"))
    assert "resumed: epoch 2, batch 0" in out and "data-parallel over 3 ranks" in out
    losses = [[json.loads(ln)["loss"] for ln in open(d / "steps.jsonl")] for d in (tmp_path / "one", tmp_path / "many")]
    assert len(losses[0]) == len(losses[1])
    # float32 over two epochs (90 steps): rounding that differs with the number of ranks grows, slowly
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-4)
    a, _ = load_checkpoint(str(tmp_path / "one" / "checkpoint.safetensors"))
    b, _ = load_checkpoint(str(tmp_path / "many" / "checkpoint.safetensors"))
    for k in a:
        assert np.linalg.norm(b[k] - a[k]) <= 1e-4 * np.linalg.norm(a[k]), k


def test_one_rank_trains_what_one_process_trains():
    """DataParallel over a communicator of one rank (this process): the buckets and the communication
    thread change nothing; synchronized BatchNorm's backward (float64 sums in Python, not the
    kernel's) only the rounding of ResNet-20's training."""
    MPI = pytest.importorskip("mpi4py.MPI")
    import minidnn as mdn
    from minidnn import nn, optim
    from minidnn.models import resnet20
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((4, 3, 32, 32)), rng.integers(0, 10, 4)) for _ in range(2)]
    states, losses = [], []
    for parallel in (None, mdn.distributed.DataParallel(MPI.COMM_WORLD, bucket_bytes=8192, tail_bytes=1024)):
        net = resnet20()
        net.init_parameters(0)
        trainer = mdn.compile(net, (4, 3, 32, 32), nn.CrossEntropyLoss(), optim.SGD(lr=0.1, momentum=0.9),
                              dtype=np.float64, parallel=parallel)
        losses.append([trainer.step(x, y) for x, y in batches])
        if parallel is not None:
            assert len(trainer.parallel.reducer.buckets) > 10
            trainer.parallel.close()
        states.append({k: np.array(v) for k, v in net.state_dict().items()})
    assert losses[0][0] == losses[1][0]          # the first forward: the same kernels, bit for bit
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-14)
    for k in states[0]:
        np.testing.assert_allclose(states[1][k], states[0][k], rtol=1e-12, atol=1e-15, err_msg=k)


def test_synchronized_batchnorm_refuses_a_split_into_stages():
    """bn="exact" splits each BatchNorm into ops whose statistics are not synchronized: refused,
    naming the way out, before any step runs."""
    MPI = pytest.importorskip("mpi4py.MPI")
    import minidnn as mdn
    from minidnn import nn, optim
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                        nn.Linear(8 * 8 * 8, 10))
    net.init_parameters(0)
    parallel = mdn.distributed.DataParallel(MPI.COMM_WORLD)
    trainer = mdn.compile(net, (8, 3, 8, 8), nn.CrossEntropyLoss(), optim.SGD(lr=0.1), dtype=np.float64,
                          memory=mdn.MemoryConfig(budget=0.5, bn="exact"), parallel=parallel)
    before = {k: np.array(v) for k, v in net.state_dict().items()}
    with pytest.raises(mdn.DistributedError, match="DataParallel\\(bn='local'\\)"):
        trainer.step(np.zeros((8, 3, 8, 8)), np.zeros(8, np.int64))
    trainer.parallel.close()
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def test_a_rank_given_the_global_batch_is_refused():
    """Each rank takes its slice: one given more than the compiled global mini-batch (all of it,
    on two ranks) is refused before the step changes anything."""
    MPI = pytest.importorskip("mpi4py.MPI")
    import minidnn as mdn
    from minidnn import nn, optim
    from dist_worker import small_cnn
    net = small_cnn()
    net.init_parameters(0)
    trainer = mdn.compile(net, (4, 3, 8, 8), nn.CrossEntropyLoss(), optim.SGD(lr=0.1),
                          parallel=mdn.distributed.DataParallel(MPI.COMM_WORLD))
    with pytest.raises(mdn.DistributedError, match="more than the global mini-batch of 4"):
        trainer.step(np.zeros((8, 3, 8, 8)), np.zeros(8, np.int64))
    assert trainer.steps_done == 0
    trainer.parallel.close()
