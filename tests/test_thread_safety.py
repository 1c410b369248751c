"""One trainer, several threads; exceptions that come from elsewhere than the step (issue 31, items 3 and 4).

``step`` and ``predict`` share the trainer's arena, plans and counters: called from two threads
they run one at a time, each as if called alone. A signal handler that raises (a harness's
timeout, a notebook's) is held like Ctrl-C and delivered at a safe point, so a step it stops
leaves the state of before or after the step, and no lane keeps writing the arena.
"""
import os
import signal
import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import minidnn as mdn
from minidnn import nn, optim
from networks import make_resnet
from test_atomic_step import differing, state_of, traced_step

SHAPE = (8, 3, 16, 16)


@pytest.fixture
def one_blas_thread():
    """Threaded OpenBLAS rounds some products differently when a thread other than the last caller
    calls it (even one call at a time), so bitwise comparisons across threads run it on one thread."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def batch(seed, shape=SHAPE):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0])


def build():
    """BatchNorm (statistics a forward moves), dropout (the trainer's random stream) and momentum."""
    net = make_resnet(nn, dropout=True).init_parameters(0)
    return mdn.compile(net, SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.05, momentum=0.9), seed=1)


def in_threads(*fns):
    """Run each function in its own thread, started together; re-raise the first error of any."""
    errors, start = [], threading.Barrier(len(fns), timeout=30)

    def run(fn):
        try:
            start.wait()
            fn()
        except BaseException as e:       # noqa: B036 - surfaced below, in the test's thread
            errors.append(e)
    threads = [threading.Thread(target=run, args=(fn,)) for fn in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]


def test_steps_from_two_threads_run_one_at_a_time(one_blas_thread):
    """Every step on the same batch: whatever the interleaving, 2n steps give the losses and the
    state of 2n steps in one thread (before the lock: IndexErrors, NaN losses, steps lost)."""
    n, (x, y) = 5, batch(0)
    reference = build()
    expected = [reference.step(x, y) for _ in range(2 * n)]
    trainer, losses = build(), []

    def steps():
        for _ in range(n):
            losses.append(trainer.step(x, y))
    in_threads(steps, steps)
    assert trainer.steps_done == 2 * n
    assert sorted(losses) == sorted(expected)
    assert not differing(state_of(trainer), state_of(reference))


def test_predict_while_another_thread_steps_sees_the_weights_of_a_step_boundary(one_blas_thread):
    n, (x, y) = 5, batch(0)
    probe = batch(1)[0]
    reference = build()
    boundaries = [reference.predict(probe)]
    for _ in range(n):
        reference.step(x, y)
        boundaries.append(reference.predict(probe))
    trainer, seen, done = build(), [], threading.Event()

    def steps():
        try:
            for _ in range(n):
                trainer.step(x, y)
        finally:
            done.set()

    def predictions():
        while not done.is_set():
            seen.append(trainer.predict(probe))
    in_threads(steps, predictions)
    assert seen
    for out in seen:
        assert any(np.array_equal(out, b) for b in boundaries), "a prediction mixed two steps' weights"
    assert not differing(state_of(trainer), state_of(reference))


class Alarm(Exception):
    """What a harness's timeout handler raises."""


def lane_network():
    """32x32 planes: the CPU plans run their convolutions on lanes (backend/lanes.py)."""
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                        nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 32 * 32, 10))
    return net.init_parameters(0)


class Raiser:
    """A trace function that sends SIGALRM at its ``at``-th event (0: never); counting, it notes the
    events inside a lanes' wait (backend/lanes.py) and inside an optimizer update."""

    def __init__(self, at=0):
        self.at, self.n, self.marks = at, 0, {"lanes": [], "update": []}

    def __call__(self, frame, event, arg):
        self.n += 1
        if not self.at:
            f = frame
            while f is not None:
                where = (f.f_code.co_name, os.path.basename(f.f_code.co_filename))
                if where in (("run", "lanes.py"), ("update", "optim.py")):
                    self.marks["lanes" if where[1] == "lanes.py" else "update"].append(self.n)
                    break
                f = f.f_back
        if self.n == self.at:
            signal.raise_signal(signal.SIGALRM)
        return self


def test_a_signal_handler_that_raises_anywhere_in_a_step_leaves_the_state_of_before_or_after():
    """A SIGALRM handler that raises, at seeded events of steps whose convolutions run on lanes:
    while the lanes run, in the updates, anywhere. Each exception leaves the state of before the
    step (and the step, run again, gives the uninterrupted loss) or of after it. Before: raised in a
    lane's wait, it left the lanes writing the arena; raised in the updates, parameters half-updated."""
    from minidnn.ops import conv_algos
    shape = (8, 3, 32, 32)
    make = lambda: mdn.compile(lane_network(), shape, nn.CrossEntropyLoss(),  # noqa: E731
                               optim.SGD(lr=0.05, momentum=0.9), seed=1)
    trainer, reference = make(), make()
    trainer.step(*batch(100, shape))
    reference.step(*batch(100, shape))

    def alarm(signum, frame):
        raise Alarm
    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        counter = Raiser()
        traced_step(trainer, *batch(101, shape), counter)
        reference.step(*batch(101, shape))
        marks = counter.marks
        if conv_algos.default_lanes() >= 2:
            assert marks["lanes"], "no lanes ran in the step"
        assert marks["update"]
        rng = np.random.default_rng(0)
        ats = [int(rng.choice(m)) for m in (marks["lanes"], marks["update"]) if m for _ in range(6)]
        ats += [int(k) for k in rng.integers(1, counter.n + 1, 4)]
        outcomes = {"before": 0, "after": 0}
        for j, k in enumerate(ats):
            x, y = batch(j, shape)
            before = state_of(reference)
            loss = reference.step(x, y)
            after = state_of(reference)
            try:
                got = traced_step(trainer, x, y, Raiser(k))
            except Alarm:
                now = state_of(trainer)
                if differing(now, after):
                    assert not differing(now, before), (k, differing(now, before))
                    outcomes["before"] += 1
                    got = trainer.step(x, y)
                else:
                    outcomes["after"] += 1
                    got = loss
            assert got == loss, k
            assert not differing(state_of(trainer), after), k
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert outcomes["before"] and outcomes["after"], outcomes
