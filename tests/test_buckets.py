"""Gradient buckets: contiguous ranges of the persistent region, ordered by when the schedule
writes their last gradient, the first and the last one small."""
import minidnn as mdn  # noqa: F401  first (see conftest)
import numpy as np
import pytest
from minidnn import nn, optim
from minidnn.autograd import build_schedule
from minidnn.backend import get_backend
from minidnn.distributed.buckets import gradient_buckets, last_writes, ready_steps
from minidnn.graph import trace
from minidnn.persistent import PersistentStore, persistent_offsets
from minidnn.schedule import PARAM_GRAD, aligned
from minidnn.models import resnet20


def _schedule(net, batch=2, accumulate=False):
    graph = trace(net, (batch, 3, 32, 32), np.float32, loss=nn.CrossEntropyLoss())
    return build_schedule(graph, optimizer=optim.SGD(lr=0.1, momentum=0.9), accumulate=accumulate,
                          updates=not accumulate)


@pytest.mark.parametrize("bucket_bytes,tail_bytes", [(64 << 10, 8 << 10), (1 << 20, 1 << 20), (1, 1)])
def test_buckets_partition_the_gradients_in_order_of_readiness(bucket_bytes, tail_bytes):
    net = resnet20()
    sched = _schedule(net)
    buckets = gradient_buckets(sched, bucket_bytes, tail_bytes)
    offsets = persistent_offsets(sched)
    grads = [t.id for t in sched.tensors if t.category == PARAM_GRAD]
    # every gradient in exactly one bucket, lying inside its byte range
    assert sorted(t for b in buckets for t in b.grads) == sorted(grads)
    for b in buckets:
        for t in b.grads:
            assert b.start <= offsets[t] and offsets[t] + sched.tensor(t).nbytes <= b.stop
        # contiguous: the range holds nothing but its gradients (and their padding)
        assert b.nbytes == sum(aligned(sched.tensor(t).nbytes) for t in b.grads)
        single = len(b.grads) == 1
        cap = tail_bytes if b is buckets[-1] or b is buckets[0] else bucket_bytes
        assert single or b.nbytes <= cap
    # ranges are disjoint and cover the gradients' part of the region
    spans = sorted((b.start, b.stop) for b in buckets)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    # ordered by readiness; ready is the last step writing any of its gradients
    last = last_writes(sched.steps, sched.tensors)
    assert [b.ready for b in buckets] == sorted(b.ready for b in buckets)
    for b in buckets:
        assert b.ready == max(last[t] for t in b.grads)
        assert sched.steps[b.ready].kind in ("backward", "accumulate")
    assert [b.index for b in buckets] == list(range(len(buckets)))
    # the last bucket is the one the backward finishes with: the first convolution's weight
    first_conv = next(t for t in grads if sched.tensor(t).value.param is net.conv1.weight)
    assert first_conv in buckets[-1].grads


def test_bucket_sizes_bound_the_count():
    sched = _schedule(resnet20())
    small = gradient_buckets(sched, 16 << 10, 4 << 10)
    large = gradient_buckets(sched, 1 << 30, 4 << 10)
    assert len(small) > len(large) >= 2        # the tail is cut off even from one large bucket
    assert large[-1].nbytes <= 4 << 10
    with pytest.raises(ValueError):
        gradient_buckets(sched, 0)


def test_buckets_are_views_of_the_gradients():
    net = resnet20()
    sched = _schedule(net)
    store = PersistentStore(get_backend("cpu"), sched, optim.SGD(lr=0.1))
    for b in gradient_buckets(sched, 32 << 10, 4 << 10):
        view = store.region[b.start:b.stop].view(np.float32)
        view[...] = b.index + 1
        for t in b.grads:
            g = sched.tensor(t).value.param.grad
            assert np.shares_memory(g, view) and (g == b.index + 1).all()


def test_ready_steps_of_a_sub_batch_schedule():
    net = resnet20()
    layout = _schedule(net, batch=4)
    sub = _schedule(net, batch=2, accumulate=True)
    buckets = gradient_buckets(layout, 32 << 10, 4 << 10)
    ready = ready_steps(buckets, layout, sub.steps, sub.tensors)
    # the sub-batch schedule adds its gradients in accumulate steps; its readiness is its own
    last = {id(sub.tensor(t).value.param): i for t, i in last_writes(sub.steps, sub.tensors).items()}
    for b, r in zip(buckets, ready):
        assert r == max(last[id(layout.tensor(t).value.param)] for t in b.grads)
    assert ready == sorted(ready)


def test_small_gradients_still_make_several_buckets():
    from minidnn.distributed.buckets import BUCKET_BYTES, MIN_BUCKETS, TAIL_BYTES, bucket_sizes
    sched = _schedule(resnet20())
    total = sum(aligned(t.nbytes) for t in sched.tensors if t.category == PARAM_GRAD)
    assert total < BUCKET_BYTES                 # ResNet-20's gradients fit one default bucket
    buckets = gradient_buckets(sched)
    assert len(buckets) >= MIN_BUCKETS
    assert buckets[-1].nbytes <= bucket_sizes(total)[1] or len(buckets[-1].grads) == 1
    # large gradients: the default caps
    assert bucket_sizes(1 << 34) == (BUCKET_BYTES, TAIL_BYTES)
