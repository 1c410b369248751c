"""The executor's side of the gradient reduction: each bucket starts right after the step that writes
its last gradient, and each update waits for its own bucket only (no MPI: a recording stand-in)."""
import threading

import minidnn as mdn
import numpy as np
from minidnn import nn, optim
from minidnn.distributed.reduction import GradientReducer, Reduction
from minidnn.executor import Context
from minidnn.models import resnet20


class _Done:
    def __init__(self):
        self.done = threading.Event()
        self.done.set()
        self.seconds = None

    def wait(self, timeout=None):
        pass


class _Logged(Reduction):
    def __init__(self, reducer, log):
        super().__init__(reducer)
        self.log, self.step = log, -1

    def after(self, plan, i, rec=None):
        self.step = i
        super().after(plan, i, rec)

    def before(self, plan, i, rec=None):
        self.step = i
        super().before(plan, i, rec)

    def start(self, k):
        if self.pending[k] is None:
            self.log.append(("start", k, self.step))
        super().start(k)

    def wait(self, k, rec=None, i=-1):
        self.log.append(("wait", k, i))
        super().wait(k, rec, i)


def test_buckets_start_when_written_and_each_update_waits_for_its_own():
    net = resnet20()
    net.init_parameters(0)
    trainer = mdn.compile(net, (2, 3, 32, 32), nn.CrossEntropyLoss(), optim.SGD(lr=0.1), dtype=np.float64)
    plan = trainer.plan
    views = []
    reducer = GradientReducer(lambda v: views.append(v) or _Done(), trainer.store, 16 << 10, 2 << 10)
    log = []
    ctx = Context.on(trainer.backend, trainer.rng)
    ctx.grads = _Logged(reducer, log)
    rng = np.random.default_rng(0)
    trainer.executor.run(plan, ctx, [rng.standard_normal((2, 3, 32, 32)), np.array([1, 2])], trainer.optimizer, 1)

    steps = plan.program.steps
    starts = [(k, i) for what, k, i in log if what == "start"]
    assert [k for k, _ in starts] == list(range(len(reducer.buckets)))     # in the buckets' order
    last = max(i for i, s in enumerate(steps) if s.kind == "backward")
    for k, i in starts:
        b = reducer.buckets[k]
        written = [j for j, s in enumerate(steps) for t in s.writes + s.updates
                   if plan.program.tensors[t].category == "gradient"
                   and plan.program.tensors[t].value.param in {trainer.store.schedule.tensor(g).value.param
                                                               for g in b.grads}]
        assert i == max(written)                 # right after its last gradient, not later
    assert starts[0][1] < last                   # reductions start while the backward runs
    waits = [(k, i) for what, k, i in log if what == "wait"]
    updates = [i for i, s in enumerate(steps) if s.kind == "update"]
    assert sorted(i for _, i in waits) == updates                          # one wait per update
    for k, i in waits:
        grad = plan.program.tensors[steps[i].ins[1]]
        assert any(trainer.store.schedule.tensor(g).value.param is grad.value.param for g in reducer.buckets[k].grads)
    # the reduced buffers are the region's own bytes (views, not copies)
    assert all(np.shares_memory(v, trainer.store.region) for v in views)
