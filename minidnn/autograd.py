"""Static reverse-mode autodiff: a traced Graph in, the iteration's Schedule out.

The backward of each node reads only what its op declared (``saved_inputs``,
``saved_outputs``), so the planner sees every tensor a backward keeps alive.
A value with several consumers gets its gradient from the first backward that
reaches it (the last consumer) and the others add partial gradients into it
with explicit ``accumulate`` steps.
"""
from __future__ import annotations

from .graph import Spec
from .schedule import (ACT, ACT_GRAD, INPUT, OPT_STATE, PARAM, PARAM_GRAD, STATE, WORKSPACE, Schedule,
                       Step, Tensor)

_VALUE_CATEGORY = {"input": INPUT, "label": INPUT, "param": PARAM, "state": STATE, "activation": ACT}


class _Builder:
    def __init__(self, graph):
        self.graph = graph
        self.tensors: list[Tensor] = []
        self.steps: list[Step] = []

    def tensor(self, name, spec, category, value=None, slot=None) -> int:
        t = Tensor(len(self.tensors), name, spec, category, value, slot)
        self.tensors.append(t)
        return t.id

    def step(self, kind, label, node=None, workspace=0, **kw) -> Step:
        s = Step(len(self.steps), kind, label, node, **kw)
        if workspace:
            s.ws = self.tensor(f"{label}:workspace", Spec((workspace,), "uint8"), WORKSPACE)
        self.steps.append(s)
        return s


def _requires_grad(graph) -> set:
    req = {v.id for v in graph.values if v.kind == "param" and v.param.requires_grad}
    for n in graph.nodes:
        if any(v.id in req for i, v in enumerate(n.inputs) if i not in n.op.no_grad_inputs):
            req.update(o.id for o in n.outputs)
    return req


def build_schedule(graph, training=True, optimizer=None, accumulate=False, updates=True,
                   load_each_input=False) -> Schedule:
    """The steps of one iteration: load, forward, and with ``training`` the
    backward from the graph's scalar output and one update step per parameter.

    All inputs are loaded by a first step; with ``load_each_input``, each input
    by a step of its own just before its first reader (a mini-batch split into
    sub-batches in one graph loads one sub-batch at a time).

    With ``accumulate`` (a sub-batch of a split mini-batch) parameter gradients
    are added into the persistent gradients instead of overwriting them; without
    ``updates`` the optimizer's state is held (it is on the device all the
    same) but no update step runs.
    """
    b = _Builder(graph)
    vt = {v.id: b.tensor(v.name, v.spec, _VALUE_CATEGORY[v.kind], v) for v in graph.values}
    inputs = [vt[v.id] for v in graph.inputs]
    pending = {v.id for v in graph.inputs} if load_each_input else set()
    if not load_each_input:
        b.step("load", "load", writes=list(inputs), outs=list(inputs))

    for n in graph.nodes:
        for v in n.inputs:
            if v.id in pending:
                pending.discard(v.id)
                b.step("load", f"load {v.name}", writes=[vt[v.id]], outs=[vt[v.id]])
        ins = [v.spec for v in n.inputs]
        outs = [v.spec for v in n.outputs]
        s = b.step("forward", n.label, n, n.op.workspace(ins, outs),
                   reads=sorted({vt[v.id] for v in n.inputs}), writes=[vt[o.id] for o in n.outputs],
                   ins=[vt[v.id] for v in n.inputs], outs=[vt[o.id] for o in n.outputs])
        s.flops = n.op.flops(ins, outs)

    sched = Schedule(b.tensors, b.steps, graph, inputs=inputs, outputs=[vt[v.id] for v in graph.outputs])
    if not training:
        return sched
    (loss,) = graph.outputs
    if loss.shape != () or loss.producer is None or not loss.producer.op.is_loss:
        raise ValueError("training needs the graph's output to be a scalar loss")
    sched.loss = vt[loss.id]
    _backward(b, graph, vt, sched, accumulate)
    if optimizer is not None:
        _updates(b, graph, vt, sched, optimizer, steps=updates)
    sched.steps = b.steps
    return sched


def _backward(b, graph, vt, sched, accumulate=False):
    req = _requires_grad(graph)
    grad_of: dict[int, int] = {}   # value id -> gradient tensor id
    for n in reversed(graph.nodes):
        op = n.op
        gouts = [grad_of.get(o.id) for o in n.outputs]
        if not op.is_loss and all(g is None for g in gouts):
            continue
        wanted = [i for i, v in enumerate(n.inputs) if v.id in req and i not in op.no_grad_inputs]
        if not wanted:
            continue
        gins, partials, adds = [None] * len(n.inputs), [], []
        for i in wanted:
            v = n.inputs[i]
            if v.id in grad_of and i in op.accumulating_inputs:   # a later consumer made it: add in place
                gins[i] = grad_of[v.id]
                adds.append(i)
            elif v.id in grad_of:          # a later consumer already made it: write a partial
                p = b.tensor(f"{v.name}:grad.partial", v.spec, ACT_GRAD, v)
                gins[i] = p
                partials.append((grad_of[v.id], p))
            elif accumulate and v.kind == "param":  # add into the gradient of earlier sub-batches
                grad_of[v.id] = b.tensor(f"{v.name}:grad", v.spec, PARAM_GRAD, v)
                if i in op.accumulating_inputs:     # the op adds in place: no partial buffer
                    gins[i] = grad_of[v.id]
                    adds.append(i)
                else:
                    gins[i] = b.tensor(f"{v.name}:grad.partial", v.spec, ACT_GRAD, v)
                    partials.append((grad_of[v.id], gins[i]))
            else:
                cat = PARAM_GRAD if v.kind == "param" else ACT_GRAD
                grad_of[v.id] = gins[i] = b.tensor(f"{v.name}:grad", v.spec, cat, v)
        ins = [vt[n.inputs[i].id] if i in op.saved_inputs else None for i in range(len(n.inputs))]
        outs = [vt[o.id] if i in op.saved_outputs else None for i, o in enumerate(n.outputs)]
        specs_in = [v.spec for v in n.inputs]
        specs_out = [o.spec for o in n.outputs]
        reads = {t for t in ins + outs + gouts if t is not None}
        added = {gins[i] for i in adds}    # read-modify-written: an evicted one is restored first
        s = b.step("backward", n.label, n, op.backward_workspace(specs_in, specs_out),
                   reads=sorted(reads), writes=sorted({g for g in gins if g is not None} - added),
                   updates=sorted(added), ins=ins, outs=outs, gouts=gouts, gins=gins, accumulate=tuple(adds))
        s.flops = 2 * op.flops(specs_in, specs_out)
        for target, p in partials:
            b.step("accumulate", f"{n.label}:accumulate", reads=[p], updates=[target])
    for v in graph.params:
        if v.id in grad_of:
            sched.param_grads[vt[v.id]] = grad_of[v.id]


def build_update_schedule(graph, optimizer) -> Schedule:
    """Only the optimizer's update steps, for the parameters the loss of ``graph`` reaches
    (the end of a mini-batch split into sub-batches)."""
    b = _Builder(graph)
    req = _requires_grad(graph)
    reached = {v.id for n in graph.nodes for i, v in enumerate(n.inputs)
               if v.kind == "param" and v.id in req and i not in n.op.no_grad_inputs}
    vt = {v.id: b.tensor(v.name, v.spec, PARAM, v) for v in graph.params if v.id in reached}
    sched = Schedule(b.tensors, b.steps, graph)
    sched.param_grads = {vt[v.id]: b.tensor(f"{v.name}:grad", v.spec, PARAM_GRAD, v)
                         for v in graph.params if v.id in reached}
    _updates(b, graph, vt, sched, optimizer)
    sched.steps = b.steps
    return sched


def _updates(b, graph, vt, sched, optimizer, steps=True):
    for v in graph.params:
        if v.id not in vt or vt[v.id] not in sched.param_grads:
            continue                       # unused by the loss: no gradient, no update
        states = [b.tensor(f"{v.name}:{name}", v.spec, OPT_STATE, v, name) for name in optimizer.state_names]
        if not steps:
            continue
        pid = vt[v.id]
        b.step("update", f"{v.name}:update", workspace=optimizer.workspace(v.spec),
               reads=[sched.param_grads[pid]], updates=[pid] + states, ins=[pid, sched.param_grads[pid]],
               outs=states)
