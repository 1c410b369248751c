"""Lanes: the CPU backend's single-threaded workers for batch-parallel convolutions."""
import threading

import numpy as np
import pytest

_C = pytest.importorskip("minidnn._C")

from threadpoolctl import threadpool_info  # noqa: E402

from minidnn.backend.lanes import Lanes  # noqa: E402
from minidnn.graph import Spec  # noqa: E402
from minidnn.ops import conv_algos  # noqa: E402
from minidnn.ops.conv import Conv2dOp  # noqa: E402


def blas_threads():
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_lanes_run_every_index_once_side_by_side_with_one_blas_thread():
    lanes, seen, inside = Lanes(_C), [], []
    before = blas_threads()
    barrier = threading.Barrier(3, timeout=10)     # three lanes must all be running at once

    def fn(j):
        inside.append((blas_threads(), _C.get_num_threads()))
        barrier.wait()
        seen.append(j)
    lanes.run(fn, 3)
    lanes.close()
    assert sorted(seen) == [0, 1, 2]
    assert all(b == [1] * len(before) and omp == 1 for b, omp in inside)
    assert blas_threads() == before


def test_a_failing_lane_raises_after_all_lanes_are_done_and_restores_blas():
    lanes, done = Lanes(_C), []
    before = blas_threads()

    def fn(j):
        if j == 0:
            raise RuntimeError("lane 0 failed")
        done.append(j)
    with pytest.raises(RuntimeError, match="lane 0 failed"):
        lanes.run(fn, 2)
    lanes.close()
    assert done == [1] and blas_threads() == before


def test_an_exception_raised_while_the_lanes_run_waits_for_them():
    """A signal handler that raises in the calling thread while it waits on the lanes: ``run`` returns
    (re-raising it) only once no lane runs any more - they write the arena - and BLAS is restored."""
    import signal

    class Alarm(Exception):
        pass
    lanes, done = Lanes(_C), []
    before = blas_threads()
    started = threading.Barrier(2, timeout=10)     # both lanes running when the signal comes

    def fn(j):
        started.wait()
        if j == 0:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)
        threading.Event().wait(0.3)
        done.append(j)

    def alarm(signum, frame):
        raise Alarm
    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        with pytest.raises(Alarm):
            lanes.run(fn, 2)
    finally:
        signal.signal(signal.SIGALRM, previous)
    finished = sorted(done)
    lanes.close()
    assert finished == [0, 1]
    assert blas_threads() == before


def test_an_exception_raised_before_submit_returns_a_started_lane_still_waits_for_it(monkeypatch):
    """The window the signal test hits only by chance, made certain: the calling thread's exception
    comes after the pool has started lane 1 and before ``submit`` has returned its future, so the
    calling thread never holds it; ``run`` must still return only after lane 1 is done."""
    lanes, done = Lanes(_C), []
    started = threading.Event()

    class Interrupted(Exception):
        pass

    class Pool:
        def __init__(self, pool):
            self._pool = pool

        def submit(self, fn, *args):
            future = self._pool.submit(fn, *args)
            if args[-1] == 1:
                assert started.wait(10)
                raise Interrupted        # as a signal handler would, inside submit
            return future
    real = lanes._workers
    monkeypatch.setattr(lanes, "_workers", lambda p: Pool(real(p)))

    def fn(j):
        if j == 1:
            started.set()
            threading.Event().wait(0.3)
        done.append(j)
    with pytest.raises(Interrupted):
        lanes.run(fn, 3)
    finished = sorted(done)
    lanes.close()
    assert 1 in finished and 2 not in finished

def _conv_case(n=5):
    rng = np.random.default_rng(0)
    op = Conv2dOp(stride=1, padding=1)
    x = rng.standard_normal((n, 4, 7, 7)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    (y,) = op.infer(Spec(x.shape, x.dtype), Spec(w.shape, w.dtype))
    return op, x, w, np.empty(y.shape, np.float32), conv_algos.Geom.of(op, x, w, y)


def test_a_lane_algorithm_is_reproducible_and_needs_lanes():
    op, x, w, y, g = _conv_case()
    name = "im2col_chunk2x2"                        # chunks (0,2) (4,5) on lane 0, (2,4) on lane 1
    ws = np.empty(conv_algos.workspace(g, name, "forward"), np.uint8)
    conv = conv_algos.Convolutions(Lanes(_C))
    outs = []
    for _ in range(2):
        y[...] = np.nan
        conv.forward(op, _C, x, w, None, y, ws, name)
        outs.append(y.copy())
    np.testing.assert_array_equal(outs[0], outs[1])
    conv_algos.forward(op, _C, x, w, None, y, np.empty(conv_algos.workspace(g, "im2col", "forward"), np.uint8),
                       "im2col")
    np.testing.assert_allclose(outs[0], y, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="lanes"):
        conv_algos.forward(op, _C, x, w, None, y, ws, name)


def test_lane_workspace_counts_every_lanes_buffers():
    op, x, w, y, g = _conv_case(n=5)
    one = conv_algos.workspace(g, "im2col_chunk2", "forward")
    assert conv_algos.workspace(g, "im2col_chunk2x2", "forward") == 2 * one
    assert conv_algos.workspace(g, "im2col_chunk2x3", "forward") == 3 * one
    assert conv_algos.workspace(g, "im2col_chunk5x2", "forward") == conv_algos.workspace(g, "im2col", "forward")
    # filter gradient: lane 1's sum, and one product buffer for lane 0 (2 chunks) - lane 1 has one
    partial = conv_algos.nbytes_of(conv_algos._partials(g))
    assert conv_algos._lane_partials(5, 2, 2) == 2
    assert conv_algos.workspace(g, "im2col_chunk2x2", "backward") == 2 * one + 2 * partial


def test_cpu_plans_choose_among_lanes_device_profile_plans_do_not():
    import minidnn
    from minidnn import nn, optim
    from minidnn.memory import MemoryConfig, plan_memory
    if conv_algos.default_lanes() < 2:
        pytest.skip("the kernels run one thread: no lanes")
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                        nn.Flatten(), nn.Linear(16 * 32 * 32, 10))
    net.init_parameters(0)
    tr = minidnn.compile(net, (8, 3, 32, 32), nn.CrossEntropyLoss(), optim.SGD(lr=0.1))
    lanes = {s.algo for s in tr.plan.program.steps if s.algo and "x" in s.algo}
    assert lanes                                     # 32x32 planes: a lane variant is the fastest
    rng = np.random.default_rng(0)
    assert np.isfinite(tr.step(rng.standard_normal((8, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, 8)))
    simulated = plan_memory(tr.plan.schedule, MemoryConfig(profile="titanx-12gb"))
    assert not {s.algo for s in simulated.program.steps if s.algo and "x" in s.algo}


def test_the_cpu_backend_warns_when_numpy_came_first_with_threaded_openblas(monkeypatch):
    """OpenBLAS reads its thread timeout when NumPy loads it: imported after NumPy, minidnn cannot
    set it, and says how to; with it set (or no threaded OpenBLAS), nothing is said."""
    import warnings

    import minidnn
    from minidnn.backend.cpu import CPUBackend
    monkeypatch.setattr(minidnn, "OMP_RUNTIME_LOADED_BEFORE", False)
    for before, threaded, warns in [(True, True, True), (True, False, False), (False, True, False)]:
        monkeypatch.setattr(minidnn, "OPENBLAS_LOADED_BEFORE", before)
        monkeypatch.setattr(Lanes, "threaded_openblas", lambda self, t=threaded: t)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            CPUBackend()
        said = [str(w.message) for w in caught if "OPENBLAS_THREAD_TIMEOUT" in str(w.message)]
        assert bool(said) == warns, (before, threaded)
        if warns:
            assert "import minidnn before NumPy" in said[0]
