"""A mini-batch as k sub-batches in one graph, run stage by stage: BatchNorm with the full batch's statistics.

``split_graph(graph, k)`` takes the training graph of one sub-batch (b samples,
with its loss) and returns the graph of the whole mini-batch of k * b samples
as k copies of every node, one per sub-batch, sharing the parameters. Every
training-mode BatchNorm becomes k ``batch_norm2d_stats`` nodes, one
``batch_norm2d_combine`` and k ``batch_norm2d_apply`` nodes (ops/norm_split.py),
so it normalizes with the statistics of all k * b samples, as the unsplit step
does. The loss is the mean of the k sub-batch losses, which equals the
mini-batch's mean loss.

The combine is a barrier: nothing after a BatchNorm can run for any sub-batch
before every sub-batch has run what comes before it. So the nodes are ordered
*stage-major*: the barriers cut the graph into stages (a node's stage is the
number of barriers on its longest path from the input), and stage s runs for
sub-batch 0, then 1, ..., then its combines, then stage s + 1. Each step still
touches a single sub-batch; what one sub-batch must keep across the stages
(the values a later stage or the backward reads) is the planner's to evict
like any other tensor, so the executor's accounting and the budget hold as
for any plan. Static autodiff of this graph yields BatchNorm's exact backward,
split over the three ops' backward steps (ops/norm_split.py): the full-batch
sums are complete before any sub-batch's input gradient is finished.

The split backward finishes a BatchNorm's input gradient in place
(ops/norm_split.py), so a BatchNorm whose input has other readers (a DenseNet
layer's input, a pre-activation block's shortcut) normalizes a copy of it, one
sub-batch at a time; the planner may recompute that copy rather than keep it.
A node that reads no sample (a weight's low-precision copy under mixed
precision) runs once and serves every sub-batch. Samples stay independent
everywhere else: every activation must keep the batch as its first dimension (checked, naming the node that does not), and
the loss must be a mean over the batch (cross-entropy and MSE are). Dropout
draws its masks one sub-batch at a time, so with dropout a step is another
draw than the unsplit one's.
"""
from __future__ import annotations

import numpy as np

from .errors import ShapeError
from .graph import Graph, trace
from .ops.elementwise import ReshapeOp
from .ops.loss import MeanOfLossesOp
from .ops.norm import BatchNorm2dOp
from .ops.norm_split import BatchNormApplyOp, BatchNormCombineOp, BatchNormStatsOp


# what a user whose budget needs a split can do instead
_OPT_IN = " (MemoryConfig(bn='sub-batch') splits it with each sub-batch's own statistics, or give a larger budget)"


def _is_batch_norm(node) -> bool:
    return isinstance(node.op, BatchNorm2dOp) and node.op.training


def _batch_free(graph) -> set:
    """The ids of the nodes that read no sample: parameters and state only, directly or through
    such nodes (mixed precision's casts of the weights). They run once for all sub-batches."""
    free, values = set(), set()
    for n in graph.nodes:
        if n.inputs and all(v.kind in ("param", "state") or v.id in values for v in n.inputs):
            free.add(n.id)
            values.update(v.id for v in n.outputs)
    return free


def _check(graph, b, free):
    (loss,) = graph.outputs
    reader = {}                               # value id -> the first node that reads it
    for m in graph.nodes:
        for v in m.inputs:
            reader.setdefault(v.id, m)
    for n in graph.nodes:
        if n.id in free:
            continue
        batch_valued = n.outputs[:1] if _is_batch_norm(n) else [v for v in n.outputs if v is not loss]
        for v in batch_valued:
            if not v.shape or v.shape[0] != b:
                raise ShapeError(f"{n.label}: exact BatchNorm statistics over sub-batches need every activation "
                                 f"to keep the batch ({b}) as its first dimension; this node's output has shape "
                                 f"{v.shape}{_OPT_IN}")
        if _is_batch_norm(n):
            users = [reader[v.id] for v in n.outputs[1:] if v.id in reader]
            if users:
                first = min(users, key=graph.nodes.index)
                raise ShapeError(f"{n.label}: its batch statistics are read by {first.label}, which exact BatchNorm "
                                 f"statistics over sub-batches cannot provide{_OPT_IN}")


def _stages(graph) -> dict:
    """node id -> stage (for a BatchNorm: the stage of its input; its output is one stage later)."""
    stage_of = {v.id: 0 for v in graph.inputs}
    out = {}
    for n in graph.nodes:
        s = max((stage_of.get(v.id, 0) for v in n.inputs if v.kind in ("input", "label", "activation")), default=0)
        out[n.id] = s
        for v in n.outputs:
            stage_of[v.id] = s + 1 if _is_batch_norm(n) else s
    return out


def split_graph(graph: Graph, k: int) -> Graph:
    """The graph of ``k`` sub-batches of ``graph``'s batch, stage-major, with full-batch BatchNorm.

    Graph inputs are ordered sub-batch by sub-batch (``input[0]``, ``label[0]``,
    ``input[1]`` ...); the single output is the mean of the k losses.
    """
    b = graph.inputs[0].shape[0]
    if len(graph.outputs) != 1 or graph.outputs[0].shape != ():
        raise ValueError("exact BatchNorm statistics over sub-batches need a training graph with a scalar loss")
    free = _batch_free(graph)
    _check(graph, b, free)
    g = Graph()
    g.module_paths = dict(graph.module_paths)
    g.precision, g.autocast = graph.precision, graph.autocast   # the split ops of BatchNorm staged alike
    vmap = [{} for _ in range(k)]             # per sub-batch: value id of ``graph`` -> value of ``g``
    for j in range(k):
        for v in graph.inputs:
            vmap[j][v.id] = g.input(v.shape, v.dtype, kind=v.kind, name=f"{v.name}[{j}]")

    def value(j, v):
        return g.param(v.param, kind=v.kind) if v.kind in ("param", "state") else vmap[j][v.id]

    def emit(op, path, inputs):
        with g.scope(path):
            return g.apply(op, inputs)

    for n in graph.nodes:                     # once, shared by every sub-batch
        if n.id in free:
            for v, w in zip(n.outputs, emit(n.op, n.path, [value(0, v) for v in n.inputs])):
                for j in range(k):
                    vmap[j][v.id] = w
    stage = _stages(graph)
    stats, stats_of = {}, {}                  # BatchNorm node id -> [stats value per sub-batch], -> (mean, invstd)
    bn_input = [{} for _ in range(k)]         # per sub-batch: BatchNorm node id -> the value it normalizes
    readers = {}
    for n in graph.nodes:
        for v in n.inputs:
            readers[v.id] = readers.get(v.id, 0) + 1
    # per stage, in the graph's order: (node, what it emits there): a BatchNorm its statistics in its
    # input's stage and its normalization one stage later, any other node (not batch-free) itself
    emitted, batch_norms = {}, {}
    for n in graph.nodes:
        if _is_batch_norm(n):
            emitted.setdefault(stage[n.id], []).append((n, "stats"))
            emitted.setdefault(stage[n.id] + 1, []).append((n, "apply"))
            batch_norms.setdefault(stage[n.id], []).append(n)
        elif n.id not in free:
            emitted.setdefault(stage[n.id], []).append((n, "op"))
    for s in range(max(stage.values(), default=0) + 1):
        for j in range(k):
            for n, what in emitted.get(s, ()):
                path = f"{n.path}[{j}]"
                if what == "stats":
                    x = value(j, n.inputs[0])
                    if readers[n.inputs[0].id] > 1:   # its gradient is finished in place: the BatchNorm's own copy
                        (x,) = emit(ReshapeOp(x.shape), path, [x])
                    bn_input[j][n.id] = x
                    stats.setdefault(n.id, []).append(emit(BatchNormStatsOp(), path, [x])[0])
                elif what == "apply":
                    x, (gamma, beta) = bn_input[j][n.id], (value(j, v) for v in n.inputs[1:3])
                    (y,) = emit(BatchNormApplyOp(), path, [x, gamma, beta, *stats_of[n.id]])
                    vmap[j][n.outputs[0].id] = y
                else:
                    for v, w in zip(n.outputs, emit(n.op, path, [value(j, v) for v in n.inputs])):
                        vmap[j][v.id] = w
        for n in batch_norms.get(s, ()):
            op = BatchNormCombineOp(k, n.op.momentum, n.op.eps)
            stats_of[n.id] = emit(op, n.path, stats[n.id] + [value(0, v) for v in n.inputs[1:]])
    loss = graph.outputs[0]
    g.outputs = emit(MeanOfLossesOp(), loss.producer.path, [vmap[j][loss.id] for j in range(k)])
    return g


def step_splits(net, input_shape, loss, optimizer, dtype=np.float32, precision=None, native=frozenset()):
    """The :class:`~minidnn.memory.subbatch.Splits` of a training step of ``net`` on ``input_shape``
    (batch first): b -> (a sub-batch of b samples adding its gradients, the update alone), and
    (b, k) -> the k sub-batches of b in one graph, staged between BatchNorms. ``native``: as
    graph.trace's."""
    from .autograd import build_schedule, build_update_schedule
    from .memory.subbatch import Splits

    def graph_of(b):
        return trace(net, (b,) + tuple(input_shape[1:]), dtype, loss=loss, precision=precision, native=native)

    def sub(b):
        graph = graph_of(b)
        return (build_schedule(graph, optimizer=optimizer, accumulate=True, updates=False),
                build_update_schedule(graph, optimizer))

    def staged(b, k):
        return build_schedule(split_graph(graph_of(b), k), optimizer=optimizer, load_each_input=True)
    return Splits(sub, staged)
