"""Gradient buckets: which bytes of the persistent region are reduced together, and when.

The schedule is static, so the step after which each gradient is final is known
before the first iteration (no first-iteration rebuild). A bucket is a
contiguous byte range of the persistent region holding whole gradients (the
gradients are views into it, so reducing the range in place reduces them, with
no copy). Gradients lie in the region in the order the backward first writes
them; buckets are cut along that order and returned in the order they become
ready (their last gradient written).

The bucket that becomes ready last holds the network's first layers. Whatever
of the communication is left when the backward ends is at least that bucket's
reduction, so it is cut small (``tail_bytes``): the tail after the backward is
one short reduction. The first one ready is as small, so that communication
starts early in the backward (as PyTorch DDP's first bucket).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..persistent import persistent_offsets
from ..schedule import ALIGN, PARAM_GRAD, aligned

# PyTorch DDP's default bucket cap (25 MiB): large enough that a reduction's latency is a small
# share of its time on PCIe and 10-100 Gb/s links, small enough that several overlap the backward
BUCKET_BYTES = 25 << 20
# the last bucket: DDP's first-bucket cap (1 MiB), a reduction of a few hundred microseconds at 10 GB/s
TAIL_BYTES = 1 << 20
# where the gradients are small (ResNet-20: 1.1 MB) the caps above would make one or two buckets, the
# first ready only at the end of the backward: at least this many, so reductions start all through it
MIN_BUCKETS = 8


@dataclass(frozen=True)
class Bucket:
    """Gradients reduced as one: bytes ``[start, stop)`` of the persistent region."""

    index: int          # position in the order of readiness
    start: int          # byte offset in the persistent region
    stop: int           # end (exclusive); includes the alignment padding between its gradients
    grads: tuple        # gradient tensor ids of the schedule, in region order
    ready: int          # index of the schedule step that writes its last gradient

    @property
    def nbytes(self) -> int:
        return self.stop - self.start


def last_writes(steps, tensors) -> dict:
    """Per parameter gradient tensor id of ``tensors``: the index in ``steps`` of the last step
    writing or adding into it (a backward, or an accumulate step of a shared parameter)."""
    last = {}
    for i, s in enumerate(steps):
        for t in s.writes + s.updates:
            if tensors[t].category == PARAM_GRAD:
                last[t] = i
    return last


def bucket_sizes(grad_bytes, bucket_bytes=None, tail_bytes=None) -> tuple:
    """(bucket cap, last bucket's cap) for ``grad_bytes`` of gradients: those given, else
    :data:`BUCKET_BYTES` or less so that there are :data:`MIN_BUCKETS`, and a tail of at most
    :data:`TAIL_BYTES` and at most the bucket cap."""
    bucket = bucket_bytes if bucket_bytes is not None else min(BUCKET_BYTES, max(ALIGN, grad_bytes // MIN_BUCKETS))
    return bucket, tail_bytes if tail_bytes is not None else min(TAIL_BYTES, bucket)


def gradient_buckets(schedule, bucket_bytes=None, tail_bytes=None) -> list:
    """The gradient buckets of ``schedule``'s persistent region, in the order they become ready.

    Each holds whole gradients adjacent in the region, at most ``bucket_bytes``
    (``tail_bytes`` for the first and the last ready) unless a single gradient is larger;
    sizes not given are :func:`bucket_sizes`'. A ValueError if a size is not positive.
    """
    grads = [t for t in schedule.tensors if t.category == PARAM_GRAD]
    bucket_bytes, tail_bytes = bucket_sizes(sum(aligned(t.nbytes) for t in grads), bucket_bytes, tail_bytes)
    if bucket_bytes <= 0 or tail_bytes <= 0:
        raise ValueError(f"bucket sizes must be positive, got {bucket_bytes} and {tail_bytes}")
    offsets = persistent_offsets(schedule)
    last = last_writes(schedule.steps, schedule.tensors)
    # the region's tensors in order; a run of gradients is broken by any other persistent tensor
    region = sorted(offsets, key=offsets.get)
    runs, run = [], []
    for tid in region:
        if tid in last:
            run.append(tid)
        elif run:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    if not runs:
        return []
    # the region's first gradients (the first written) make a first bucket of at most tail_bytes,
    # so communication starts early; the rest is cut from its end, the first cut at tail_bytes
    head, size = [], 0
    while runs[0] and (not head or size + aligned(schedule.tensor(runs[0][0]).nbytes) <= tail_bytes):
        size += aligned(schedule.tensor(runs[0][0]).nbytes)
        head.append(runs[0].pop(0))
    groups, cap = [head], tail_bytes
    for run in reversed([r for r in runs if r]):
        group, size = [], 0
        for tid in reversed(run):
            nbytes = aligned(schedule.tensor(tid).nbytes)
            if group and size + nbytes > cap:
                groups.append(group[::-1])
                group, size, cap = [], 0, bucket_bytes
            group.append(tid)
            size += nbytes
        groups.append(group[::-1])
        cap = bucket_bytes
    groups.sort(key=lambda g: (max(last[t] for t in g), offsets[g[0]]))
    return [Bucket(k, offsets[g[0]], offsets[g[-1]] + aligned(schedule.tensor(g[-1]).nbytes), tuple(g),
                   max(last[t] for t in g)) for k, g in enumerate(groups)]


def ready_steps(buckets, layout, steps, tensors) -> list:
    """Per bucket, the index in ``steps`` (another schedule's or a lowered program's, of the same
    model) after which it is ready: its gradients are matched to ``layout``'s (the schedule that
    laid out the region) by parameter. None for a bucket that ``steps`` never writes."""
    last = {id(tensors[t].value.param): i for t, i in last_writes(steps, tensors).items()}
    out = []
    for b in buckets:
        idx = [last.get(id(layout.tensor(t).value.param)) for t in b.grads]
        out.append(None if None in idx else max(idx))
    return out
