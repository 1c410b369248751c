"""A step is all or nothing: on any exception, Ctrl-C included, the parameters, optimizer state,
BatchNorm statistics, ``num_batches_tracked``, the step counter and the random stream are those of
before the step, or (an interrupt that came after the commit point) those of after it; the next
step then gives bitwise the result of an uninterrupted one.

The fault injection delivers a real SIGINT (``signal.raise_signal``, through whatever handler is
installed) at the k-th Python trace event of a step, for seeded random k over the whole step and
over its update phase, on a plain plan, one with offloads and recomputation, a sub-batched one and
a staged one (exact BatchNorm), and on Adam, whose update is a sequence of in-place array ops.
"""

import os
import signal
import sys
import tracemalloc
import zlib

import numpy as np
import pytest

import minidnn as mdn
from harness import host
from minidnn import nn, optim
from minidnn.graph import Spec
from minidnn.memory import MemoryConfig
from networks import make_resnet

SHAPE = (8, 3, 16, 16)


def batch(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(SHAPE).astype(np.float32), rng.integers(0, 10, SHAPE[0])


def build(memory=None, optimizer="sgd", dropout=True, device="cpu"):
    net = make_resnet(nn, dropout=dropout).init_parameters(0)
    opt = (optim.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4) if optimizer == "sgd"
           else optim.Adam(lr=1e-3, weight_decay=1e-4))
    return mdn.compile(net, SHAPE, nn.CrossEntropyLoss(), opt, memory=memory, seed=1, device=device)


def state_of(trainer):
    """Everything a step may change, copied."""
    s = {k: host(v).copy() for k, v in trainer.net.state_dict().items()}
    for name, p in trainer.net.named_parameters():
        for n in trainer.optimizer.state_names:
            s[f"{name}:{n}"] = host(trainer.store.optimizer_state(p, n)).copy()
    s["steps_done"] = np.array(trainer.steps_done)
    s["rng"] = np.array(repr(trainer.rng.bit_generator.state))
    return s


def differing(a, b):
    return [k for k in a if not np.array_equal(a[k], b[k])]


class Interrupt:
    """A trace function that raises SIGINT at its ``at``-th event (0: never) and counts events."""

    def __init__(self, at=0):
        self.at, self.n, self.first_update = at, 0, None

    def __call__(self, frame, event, arg):
        self.n += 1
        if self.first_update is None and event == "call" and frame.f_code.co_name == "update":
            self.first_update = self.n
        if self.n == self.at:
            signal.raise_signal(signal.SIGINT)
        return self


def traced_step(trainer, x, y, tracer):
    sys.settrace(tracer)
    try:
        return trainer.step(x, y)
    finally:
        sys.settrace(None)


def assert_clean_copy_stream(trainer):
    copies = trainer.executor.copies
    assert copies is None or copies._q.unfinished_tasks == 0, "copies still queued after the step"


def fault_injection(trainer, reference, trials, seed):
    """Steps ``trainer`` and ``reference`` in lockstep, interrupting each of the trainer's steps once."""
    assert os.name == "posix"
    trainer.step(*batch(100))                # momentum and BN statistics away from their initial values
    reference.step(*batch(100))
    counter = Interrupt()
    traced_step(trainer, *batch(101), counter)
    reference.step(*batch(101))
    assert counter.first_update is not None
    rng = np.random.default_rng(seed)
    ks = list(rng.integers(1, counter.n + 1, trials)) + list(rng.integers(counter.first_update, counter.n + 1, trials))
    outcomes = {"before": 0, "after": 0}
    for j, k in enumerate(ks):
        x, y = batch(j)
        before = state_of(reference)
        assert not differing(before, state_of(trainer))
        loss = reference.step(x, y)
        after = state_of(reference)
        try:
            got = traced_step(trainer, x, y, Interrupt(int(k)))
        except KeyboardInterrupt:
            now = state_of(trainer)
            if not differing(now, after):
                assert_clean_copy_stream(trainer)
                outcomes["after"] += 1
                continue
            assert not differing(now, before), (f"interrupt at event {k} of {counter.n}: changed "
                                                f"{differing(now, before)}, unchanged {differing(now, after)}")
            assert_clean_copy_stream(trainer)
            outcomes["before"] += 1
            got = trainer.step(x, y)
        assert got == loss
        assert not differing(state_of(trainer), after)
    assert outcomes["before"] and outcomes["after"], outcomes


@pytest.mark.parametrize("config", ["plain", "adam", "offload-recompute", "sub-batches", "staged"])
def test_sigint_anywhere_in_a_step_leaves_the_state_of_before_or_after_it(config):
    memory = {"offload-recompute": MemoryConfig(budget=0.6, policy="superneurons", poison=True),
              "sub-batches": "split", "staged": "split"}.get(config)
    if memory == "split":
        memory = MemoryConfig(budget=split_budget(), bn="exact" if config == "staged" else "sub-batch")
    make = lambda: build(memory, "adam" if config == "adam" else "sgd")  # noqa: E731
    trainer, reference = make(), make()
    plan = trainer.plan
    kind = {"sub-batches": "SubBatchPlan", "staged": "StagedPlan"}.get(config, "Plan")
    assert type(plan).__name__ == kind
    if config == "offload-recompute":
        kinds = {s.kind for s in plan.steps}
        assert {"offload", "prefetch", "recompute"} <= kinds, kinds
    fault_injection(trainer, reference, trials=8, seed=zlib.crc32(config.encode()))


def split_budget():
    """Between the smallest budget that fits the whole batch and the one that fits sub-batches of 1."""
    def minimum(**kw):
        with pytest.raises(mdn.MemoryBudgetError) as e:
            build(MemoryConfig(budget=4096, **kw))
        return e.value.minimum_bytes
    return (minimum(sub_batching=False) + minimum()) // 2


def test_a_sigint_from_a_timer_during_a_step():
    """The same on the operating system's path: SIGINT sent to the process after a random delay."""
    trainer, reference = build(), build()
    trainer.step(*batch(100))
    reference.step(*batch(100))
    rng = np.random.default_rng(0)
    previous = signal.signal(signal.SIGALRM, lambda s, f: os.kill(os.getpid(), signal.SIGINT))
    interrupted = 0
    try:
        for j in range(12):
            x, y = batch(j)
            before = state_of(reference)
            loss = reference.step(x, y)
            after = state_of(reference)
            signal.setitimer(signal.ITIMER_REAL, float(rng.uniform(1e-4, 5e-3)))
            try:
                got = trainer.step(x, y)
                signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:
                interrupted += 1
                now = state_of(trainer)
                if differing(now, after):
                    assert not differing(now, before), differing(now, before)
                    got = trainer.step(x, y)
                else:
                    got = loss
            assert got == loss
            assert not differing(state_of(trainer), after)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert interrupted


def test_a_non_finite_loss_leaves_the_batch_norm_statistics_as_they_were(device):
    trainer = build(device=device)
    trainer.step(*batch(0))
    before = state_of(trainer)
    trainer.net.fc.weight.data[0, 0] = np.inf         # finite statistics, then a non-finite loss
    before["fc.weight"][0, 0] = np.inf
    with pytest.raises(mdn.NumericalError):
        trainer.step(*batch(1))
    assert not differing(state_of(trainer), before), differing(state_of(trainer), before)


def test_a_failed_step_leaves_no_copy_queued_and_the_next_step_is_exact():
    """An exception raised inside a step with offloads in flight (a kernel failing at the last backward
    op): the copies are drained, the state is as before, and the trainer trains on bitwise."""
    memory = MemoryConfig(budget=0.4, poison=True)
    trainer, reference = build(memory), build(memory)
    x, y = batch(0)
    program = trainer.plan.program.steps
    last_backward = max(i for i, s in enumerate(program) if s.kind == "backward")
    op = program[last_backward].node.op
    original = type(op).backward

    def failing(self, *args):
        if self is op:
            raise MemoryError("injected")
        return original(self, *args)

    before = state_of(trainer)
    type(op).backward = failing
    try:
        with pytest.raises(MemoryError, match="injected"):
            trainer.step(x, y)
    finally:
        type(op).backward = original
    assert_clean_copy_stream(trainer)
    assert not differing(state_of(trainer), before)
    assert trainer.step(x, y) == reference.step(x, y)
    assert not differing(state_of(trainer), state_of(reference))


@pytest.mark.parametrize("opt", [optim.SGD(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=1e-4),
                                 optim.SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
                                 optim.Adam(lr=1e-3, weight_decay=1e-4), optim.AdamW(lr=1e-3)],
                         ids=["sgd-dampening", "sgd-nesterov", "adam", "adamw"])
def test_an_update_allocates_nothing_so_nothing_fails_halfway_through_the_updates(opt):
    """The array-operation updates (those of backends without a fused kernel) take every scratch
    array from their workspace: an allocation that fails (a device out of memory) could otherwise
    stop a step with some parameters updated and others not."""
    rng = np.random.default_rng(0)
    n = 1 << 16
    p, g = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    states = [np.zeros(n, np.float32) for _ in opt.state_names]
    ws = np.empty(opt.workspace(Spec((n,), np.float32)), np.uint8)
    for t in (1, 2):
        tracemalloc.start()
        try:
            opt.update(p, g, states, ws, t)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < p.nbytes // 8, f"step {t}: {peak} B allocated for a {p.nbytes} B parameter"
