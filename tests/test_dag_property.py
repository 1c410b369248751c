"""Property tests over random DAGs of ops: the plan is sound, the executor measures what the plan
predicts, and loss and gradients equal an independent NumPy (float64) evaluation of the same DAG.

The DAGs are models/random_dag.py's (its docstring lists the ops).
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import sliding_window_view

import minidnn
from minidnn import nn
from minidnn.memory import placement
from minidnn.models.random_dag import CLASSES, OPS, SHAPE, RandomDag

EPS = 1e-5
MOMENTUM = 0.1


# -- an independent NumPy reference (float64): forward, then reverse-mode over the same DAG -------

def conv_ref(x, w, b, pad):
    k = w.shape[2]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = sliding_window_view(xp, (k, k), axis=(2, 3))                  # (N, C, H, W, k, k)
    y = np.einsum("nchwij,ocij->nohw", win, w) + b[None, :, None, None]

    def back(gy):
        gw = np.einsum("nchwij,nohw->ocij", win, gy)
        gxp = np.zeros_like(xp)
        h, wd = gy.shape[2:]
        for i in range(k):
            for j in range(k):
                gxp[:, :, i:i + h, j:j + wd] += np.einsum("nohw,oc->nchw", gy, w[:, :, i, j])
        return gxp[:, :, pad:pad + x.shape[2], pad:pad + x.shape[3]], gw, gy.sum(axis=(0, 2, 3))
    return y, back


def bn_ref(x, g, b):
    m = x.shape[0] * x.shape[2] * x.shape[3]
    mean = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    inv = 1.0 / np.sqrt(var + EPS)
    xh = (x - mean[None, :, None, None]) * inv[None, :, None, None]
    y = g[None, :, None, None] * xh + b[None, :, None, None]

    def back(gy):
        gb = gy.sum(axis=(0, 2, 3))
        gg = (gy * xh).sum(axis=(0, 2, 3))
        gx = (g * inv / m)[None, :, None, None] * (m * gy - gb[None, :, None, None] - xh * gg[None, :, None, None])
        return gx, gg, gb
    return y, back, mean, var * m / (m - 1)


def maxpool_ref(x):
    """3x3, stride 1, padding 1; the first maximum in row-major window order wins (as PyTorch)."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    win = sliding_window_view(xp, (3, 3), axis=(2, 3)).reshape(n, c, h, w, 9)
    idx = win.argmax(axis=-1)
    y = np.take_along_axis(win, idx[..., None], axis=-1)[..., 0]

    def back(gy):
        gxp = np.zeros_like(xp)
        di, dj = np.divmod(idx, 3)
        nn_, cc, hh, ww = np.indices(idx.shape)
        np.add.at(gxp, (nn_, cc, hh + di, ww + dj), gy)
        return gxp[:, :, 1:-1, 1:-1]
    return y, back


def reference(spec, params, x, y):
    """(loss, {param name: grad}, {bn buffer name: new value}) of the DAG in float64."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    vals, backs, stats = [x.astype(np.float64)], {}, {}
    for k, node in enumerate(spec, start=1):
        op, a = node[0], vals[node[1]]
        if op == "conv":
            out, back = conv_ref(a, p[f"n{k}.weight"], p[f"n{k}.bias"], 1)
            backs[k] = ("conv", back)
        elif op == "cat":
            out, back = conv_ref(np.concatenate([a, vals[node[2]]], axis=1), p[f"n{k}.weight"], p[f"n{k}.bias"], 0)
            backs[k] = ("cat", back)
        elif op == "relu":
            out = np.maximum(a, 0)
            backs[k] = ("relu", lambda gy, out=out: gy * (out > 0))
        elif op == "add":
            out = a + vals[node[2]]
            backs[k] = ("add", None)
        elif op == "bn":
            out, back, mean, uvar = bn_ref(a, p[f"n{k}.weight"], p[f"n{k}.bias"])
            backs[k] = ("bn", back)
            stats[f"n{k}.running_mean"] = (1 - MOMENTUM) * p[f"n{k}.running_mean"] + MOMENTUM * mean
            stats[f"n{k}.running_var"] = (1 - MOMENTUM) * p[f"n{k}.running_var"] + MOMENTUM * uvar
        elif op == "pool":
            out, back = maxpool_ref(a)
            backs[k] = ("pool", back)
        vals.append(out)
    n = x.shape[0]
    flat = vals[-1].reshape(n, -1)
    logits = flat @ p["fc.weight"].T + p["fc.bias"]
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    loss = -logp[np.arange(n), y].mean()
    glogits = np.exp(logp)
    glogits[np.arange(n), y] -= 1
    glogits /= n
    grads = {"fc.weight": glogits.T @ flat, "fc.bias": glogits.sum(axis=0)}
    gvals = {len(spec): (glogits @ p["fc.weight"]).reshape(vals[-1].shape)}

    def acc(i, g):
        if i > 0:                      # the input needs no gradient
            gvals[i] = gvals[i] + g if i in gvals else g

    for k in range(len(spec), 0, -1):
        if k not in gvals:
            continue                   # dead code
        gy, node = gvals[k], spec[k - 1]
        kind, back = backs[k]
        if kind in ("conv", "cat", "bn"):
            gx, gw, gb = back(gy)
            grads[f"n{k}.weight"], grads[f"n{k}.bias"] = gw, gb
            if kind == "cat":
                acc(node[1], gx[:, :4])
                acc(node[2], gx[:, 4:])
            else:
                acc(node[1], gx)
        elif kind == "add":
            acc(node[1], gy)
            acc(node[2], gy)
        else:
            acc(node[1], back(gy))
    return loss, grads, stats


# -- generating DAGs ----------------------------------------------------------------------------

@st.composite
def dags(draw, max_nodes=8):
    n = draw(st.integers(1, max_nodes))
    spec = []
    for k in range(1, n + 1):
        op = draw(st.sampled_from(OPS))
        i = draw(st.integers(0, k - 1))           # node 0 (the input, which needs no gradient) included
        spec.append((op, i, draw(st.integers(0, k - 1))) if op in ("add", "cat") else (op, i))
    return spec


def make_params(net, seed):
    """Random weights for every parameter and BN buffer; returns float64 copies by name."""
    rng = np.random.default_rng(seed)
    sd = {}
    for k, v in net.state_dict().items():
        if k.endswith("num_batches_tracked"):
            sd[k] = np.array(v)
        elif k.endswith("running_var") or (k.endswith(".weight") and v.ndim == 1):
            sd[k] = rng.uniform(0.5, 1.5, v.shape)
        else:
            std = {4: 0.25, 2: 0.05, 1: 0.1}[v.ndim]   # conv, fc weights, biases: a softmax that is not saturated
            sd[k] = rng.normal(0, std, v.shape)
    net.load_state_dict(sd)            # rounds to the layers' float32; read back what they hold
    return {k: np.array(v, np.float64) for k, v in net.state_dict().items()}


def brute_force_overlaps(plan):
    """Pairs of buffers live at a common step whose byte ranges intersect (all pairs checked)."""
    keys = range(len(plan.offsets))
    bad = []
    for i, t in enumerate(keys):
        a, b = plan.spans[t]
        lo, hi = plan.offsets[t], plan.offsets[t] + plan.sizes[t]
        for u in keys[i + 1:]:
            c, d = plan.spans[u]
            if a <= d and c <= b and plan.sizes[t] and plan.sizes[u]:
                lo2, hi2 = plan.offsets[u], plan.offsets[u] + plan.sizes[u]
                if lo < hi2 and lo2 < hi:
                    bad.append((t, u))
    return bad


def check_dag(spec, seed):
    net = RandomDag(spec)
    params = make_params(net, seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal(SHAPE)
    y = rng.integers(0, CLASSES, SHAPE[0])
    trainer = minidnn.compile(net, SHAPE, nn.CrossEntropyLoss(), optimizer=None, dtype=np.float64,
                              memory=minidnn.MemoryConfig(check=True, poison=True))
    plan = trainer.plan

    # (a) no two live buffers share a byte
    assert brute_force_overlaps(plan) == []
    assert set(range(len(plan.offsets))) == set(plan.spans) == set(plan.sizes)
    for t, off in enumerate(plan.offsets):
        assert off % 64 == 0 and off >= 0
        assert off + plan.sizes[t] <= plan.arena_bytes
        a, b = plan.spans[t]
        assert 0 <= a <= b < len(plan.steps)
    # the arena is no smaller than the bytes live at any one step
    live = np.zeros(len(plan.steps), np.int64)
    for t, (a, b) in plan.spans.items():
        live[a:b + 1] += plan.sizes[t]
    assert plan.arena_bytes >= live.max()

    loss = trainer.step(x, y)

    # (b) the executor measured exactly the plan
    assert trainer.executor.high_water_bytes == plan.arena_bytes
    assert trainer.measured_peak_bytes == plan.peak_bytes

    # (c) loss, gradients and BN statistics equal the NumPy reference
    rloss, rgrads, rstats = reference(spec, params, x, y)
    assert abs(loss - rloss) <= 1e-10 * max(abs(rloss), 1.0)
    gscale = max(np.abs(g).max() for g in rgrads.values())
    for name, p in net.named_parameters():
        if name in rgrads:
            assert p.grad is not None, name
            # relative to the parameter's own gradient, with a floor for gradients that are sums of
            # much larger terms cancelling (a bias before a BN, or under a saturated softmax)
            tol = 1e-9 * np.abs(rgrads[name]).max() + 1e-12 * gscale
            assert np.abs(p.grad - rgrads[name]).max() <= tol, name
        else:                          # dead code: no gradient, or an all-zero one
            assert p.grad is None or not np.any(p.grad), name
    sd = net.state_dict()
    for name, v in rstats.items():
        np.testing.assert_allclose(sd[name], v, rtol=1e-12, atol=1e-14, err_msg=name)
    return trainer


def check_dag_under_budget(spec, seed, fraction):
    """(d) under a budget between the planner's minimum and the unlimited peak (offload, prefetch and
    recompute): the plan is sound, fits, is measured exactly, and changes no result by a single bit."""
    net = RandomDag(spec)
    make_params(net, seed)
    init = {k: np.array(v) for k, v in net.state_dict().items()}
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal(SHAPE)
    y = rng.integers(0, CLASSES, SHAPE[0])
    free = minidnn.compile(net, SHAPE, nn.CrossEntropyLoss(), optimizer=None, dtype=np.float64,
                           memory=minidnn.MemoryConfig(algorithms="default"))
    ref_loss = free.step(x, y)
    ref = {n: np.array(p.grad) for n, p in net.named_parameters() if p.grad is not None}
    ref_state = {k: np.array(v) for k, v in net.state_dict().items()}

    with pytest.raises(minidnn.MemoryBudgetError) as e:
        minidnn.compile(RandomDag(spec), SHAPE, nn.CrossEntropyLoss(), optimizer=None, dtype=np.float64,
                        memory=minidnn.MemoryConfig(budget=1, algorithms="default"))
    minimum = e.value.minimum_bytes
    peak = free.plan.peak_bytes
    assert minimum <= peak
    budget = minimum + int(fraction * (peak - minimum))

    net2 = RandomDag(spec)
    net2.load_state_dict(init)
    t = minidnn.compile(net2, SHAPE, nn.CrossEntropyLoss(), optimizer=None, dtype=np.float64,
                        memory=minidnn.MemoryConfig(budget=budget, check=True, poison=True, algorithms="default"))
    plan = t.plan
    assert plan.peak_bytes <= budget
    assert brute_force_overlaps(plan) == []
    loss = t.step(x, y)
    assert t.measured_peak_bytes == plan.peak_bytes
    assert loss == ref_loss
    for n, p in net2.named_parameters():
        if n in ref:
            assert np.array_equal(p.grad, ref[n]), n
    for k, v in net2.state_dict().items():
        assert np.array_equal(v, ref_state[k]), k     # recomputation moved no BN statistics


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=dags(), seed=st.integers(0, 2**16), fraction=st.sampled_from([0.0, 0.3, 0.7]))
@example(spec=[("conv", 0), ("conv", 1), ("relu", 0)], seed=0, fraction=0.0)   # sqrt(n) segments cannot restore
def test_random_dag_under_budget(spec, seed, fraction):
    check_dag_under_budget(spec, seed, fraction)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=dags(), seed=st.integers(0, 2**16))
def test_random_dag(spec, seed):
    check_dag(spec, seed)


# a few fixed DAGs that exercise the joins hard, whatever hypothesis draws
FIXED = [
    [("conv", 0), ("relu", 1), ("add", 1, 2), ("cat", 3, 1), ("bn", 4), ("pool", 5)],
    [("conv", 0), ("add", 1, 1), ("cat", 2, 2), ("pool", 3), ("pool", 4), ("add", 5, 1)],
    [("pool", 0), ("conv", 1), ("conv", 0), ("relu", 3), ("cat", 2, 4), ("bn", 5), ("add", 6, 2)],
    [("conv", 0), ("conv", 0), ("relu", 1)],                   # node 2 is dead code
    [("relu", 0), ("add", 0, 1), ("pool", 2), ("conv", 3)],    # the input as a join operand
]


@pytest.mark.parametrize("spec", FIXED, ids=[f"dag{i}" for i in range(len(FIXED))])
def test_fixed_dag(spec):
    check_dag(spec, 7)


def test_reference_catches_a_wrong_gradient():
    """The reference is sensitive: a perturbed parameter gives a different loss."""
    spec = FIXED[0]
    net = RandomDag(spec)
    params = make_params(net, 3)
    x = np.random.default_rng(0).standard_normal(SHAPE)
    y = np.array([0, 2])
    loss, grads, _ = reference(spec, params, x, y)
    # finite differences on one weight of the 3x3 conv confirm the reference's own gradient
    h = 1e-6
    for idx in [(0, 1, 1, 2), (3, 0, 0, 0)]:
        p2 = dict(params)
        p2["n1.weight"] = params["n1.weight"].copy()
        p2["n1.weight"][idx] += h
        lp = reference(spec, p2, x, y)[0]
        p2["n1.weight"][idx] -= 2 * h
        lm = reference(spec, p2, x, y)[0]
        assert abs((lp - lm) / (2 * h) - grads["n1.weight"][idx]) < 1e-6


def test_cat_with_network_input():
    """cat of an operand that needs no gradient (regression: CatOp.backward read g.shape of None)."""
    check_dag([("conv", 0), ("cat", 0, 1)], 5)
    check_dag([("relu", 0), ("conv", 1), ("cat", 2, 1), ("cat", 1, 1)], 6)


def test_bn_on_network_input():
    """BN of a value that needs no gradient (regression: bn_backward was handed gx=None)."""
    check_dag([("bn", 0), ("conv", 1)], 5)


# -- the placement on its own, over random lifetimes ----------------------------------------------

def _lowest_gap(i, off, starts, ends, sizes):
    """The lowest offset at which buffer ``i`` fits beside the placed buffers ``off`` it overlaps."""
    live = sorted((off[j], off[j] + sizes[j]) for j in off if starts[j] <= ends[i] and starts[i] <= ends[j])
    reach = 0
    for lo, hi in live:
        if lo - reach >= sizes[i]:
            break
        reach = max(reach, hi)
    return reach


def reference_place(starts, ends, sizes, order=placement.EARLIEST):
    """The placement rules written plainly: largest first (ties: earlier start, or LONGEST the
    longer lifetime; then lower index), into the lowest gap between overlapping placed buffers that
    holds it, else on top; LOWEST: next, always the buffer whose lowest gap is lowest (ties: earlier
    start, larger, lower index)."""
    off = {}
    if order == placement.LOWEST:
        while len(off) < len(sizes):
            i = min((i for i in range(len(sizes)) if i not in off),
                    key=lambda i: (_lowest_gap(i, off, starts, ends, sizes), starts[i], -sizes[i], i))
            off[i] = _lowest_gap(i, off, starts, ends, sizes)
    else:
        longest = order == placement.LONGEST
        for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], starts[i] - ends[i] if longest else starts[i], i)):
            off[i] = _lowest_gap(i, off, starts, ends, sizes)
    return [off[i] for i in range(len(sizes))]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 150), st.integers(0, 90), st.integers(1, 80)), min_size=1, max_size=60))
def test_place_matches_the_rule_and_never_overlaps(items):
    starts = [a for a, _, _ in items]
    ends = [a + d for a, d, _ in items]
    sizes = [64 * s for _, _, s in items]
    live = [sum(s for a, b, s in zip(starts, ends, sizes) if a <= k <= b) for k in range(max(ends) + 1)]
    orders = (placement.EARLIEST, placement.LONGEST, placement.LOWEST)
    placed = {order: placement.place(starts, ends, sizes, order=order).tolist() for order in orders}
    for order in orders:
        assert placed[order] == reference_place(starts, ends, sizes, order), order
    least = placement.place_least(starts, ends, sizes).tolist()
    first = placement.peak(placed[placement.EARLIEST], sizes)
    if first - max(live) > first // 100:
        assert placement.peak(least, sizes) == min(placement.peak(o, sizes) for o in placed.values())
    else:
        assert least == placed[placement.EARLIEST]
    n = len(items)
    for offsets in [least, *placed.values()]:
        for t in range(n):
            for u in range(t + 1, n):
                if starts[t] <= ends[u] and starts[u] <= ends[t]:
                    assert offsets[t] + sizes[t] <= offsets[u] or offsets[u] + sizes[u] <= offsets[t]
        assert placement.peak(offsets, sizes) >= max(live)


def test_longest_first_packs_where_earliest_first_fragments():
    """Three buffers of one size around a smaller one: by earliest start, the first two short ones
    take the two lowest slots at steps 1-4 and the small one, alive at steps 4-7 beside the second
    and the long third, goes above both (320 B); longest first puts the first short one beside the
    long one at offset 0, so the small one fits at 128 (256 B, the liveness peak), and
    place_least keeps that."""
    starts, ends, sizes = [4, 2, 6, 1], [7, 4, 11, 3], [64, 128, 128, 128]
    assert placement.peak(placement.place(starts, ends, sizes), sizes) == 320
    assert placement.peak(placement.place(starts, ends, sizes, order=placement.LONGEST), sizes) == 256
    assert placement.peak(placement.place_least(starts, ends, sizes), sizes) == 256 \
        == placement.live_peak(starts, ends, sizes)


def test_lowest_first_packs_where_both_largest_first_orders_fragment():
    """Two 128 B buffers (steps 0-3 and 5-8) and two of 64 B (3-4 and 4-6): largest first, in either
    order of the two large ones, puts both at 0, and the small ones stack above them at steps 3-6
    (256 B). Lowest first takes the buffer that sits lowest, the earliest start on a tie: the small
    one at steps 4-6 goes to 0, the large one after it to 64, the other small one beside the first
    large one at 128: 192 B, the liveness peak, which place_least keeps."""
    starts, ends, sizes = [0, 4, 5, 3], [3, 6, 8, 4], [128, 64, 128, 64]
    for order in (placement.EARLIEST, placement.LONGEST):
        assert placement.peak(placement.place(starts, ends, sizes, order=order), sizes) == 256
    lowest = placement.place(starts, ends, sizes, order=placement.LOWEST)
    assert lowest.tolist() == [0, 0, 64, 128]
    assert placement.peak(placement.place_least(starts, ends, sizes), sizes) == 192 \
        == placement.live_peak(starts, ends, sizes)


def test_place_base_and_bad_input():
    assert placement.place([0, 0], [3, 3], [128, 64], base=4096).tolist() == [4096, 4224]
    with pytest.raises(ValueError, match="ends"):
        placement.place([0, 1], [3], [64, 64])
    with pytest.raises(ValueError, match="lifetime"):
        placement.place([5], [3], [64])
