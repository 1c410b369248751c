"""Forward and backward of every op, through the real executor (see harness.py).

Each case is an op, its inputs (awkward shapes on purpose) and a plain NumPy
reference written here, independently of minidnn. The harness checks forward
(float64 and float32), gradients by central differences, and, where torch is
installed, forward and gradients against ``torch.nn.functional``. Dropout and
BatchNorm's running statistics have tests of their own at the end.
"""
import numpy as np
import pytest

from harness import DUMMY, OpCase, check_backward, check_forward, check_torch, compile_case, host, rng_for
from minidnn import ops


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def randn(name, *shape):
    return rng_for(name, shape).standard_normal(shape)


def away_from_zero(name, *shape):
    """Values with |v| >= 0.1, so no central difference crosses a kink at 0."""
    r = rng_for(name, shape)
    return np.where(r.random(shape) < 0.5, -1, 1) * (0.1 + r.random(shape))


def distinct(name, *shape):
    """A permutation of 0.01 * arange: no ties, and no two values within 2 * eps."""
    return rng_for(name, shape).permutation(int(np.prod(shape))).reshape(shape) * 0.01 - 1.0


# ----------------------------------------------------------- NumPy references
def ref_conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh, ow = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    y = np.zeros((n, o, oh, ow))
    for oc in range(o):
        g = oc // (o // groups)
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                           j * dw:j * dw + sw * (ow - 1) + 1:sw]
                y[:, oc] += np.tensordot(patch, w[oc, :, i, j], axes=([1], [0]))
    return y if b is None else y + b[None, :, None, None]


def ref_conv_transpose2d(x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """Scatter form: each input pixel adds w[c] times itself into the output."""
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    (oph, opw), (dh, dw) = _pair(output_padding), _pair(dilation)
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    oh = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    ow = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    full = np.zeros((n, og * groups, max((h - 1) * sh + dh * (kh - 1) + 1, ph + oh),
                     max((wd - 1) * sw + dw * (kw - 1) + 1, pw + ow)))
    for ci in range(c):
        g = ci // (c // groups)
        for i in range(kh):
            for j in range(kw):
                full[:, g * og:(g + 1) * og, i * dh:i * dh + sh * (h - 1) + 1:sh,
                     j * dw:j * dw + sw * (wd - 1) + 1:sw] += x[:, ci, None] * w[ci, :, i, j, None, None]
    y = full[:, :, ph:ph + oh, pw:pw + ow]
    return y if b is None else y + b[None, :, None, None]


def _windows(xp, k, s, d, oh, ow):
    """Every (kh*kw) shifted, strided view of the padded input, stacked on axis 0."""
    return np.stack([xp[:, :, i * d[0]:i * d[0] + s[0] * (oh - 1) + 1:s[0],
                        j * d[1]:j * d[1] + s[1] * (ow - 1) + 1:s[1]]
                     for i in range(k[0]) for j in range(k[1])])


def _pool_geom(x, kernel_size, stride, padding, dilation):
    k, p, d = _pair(kernel_size), _pair(padding), _pair(dilation)
    s = _pair(stride if stride is not None else kernel_size)
    oh = (x.shape[2] + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    ow = (x.shape[3] + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    return k, s, p, d, oh, ow


def ref_max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1):
    k, s, p, d, oh, ow = _pool_geom(x, kernel_size, stride, padding, dilation)
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=-np.inf)
    return _windows(xp, k, s, d, oh, ow).max(axis=0)


def ref_avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    k, s, p, d, oh, ow = _pool_geom(x, kernel_size, stride, padding, 1)
    pad = ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1]))
    total = _windows(np.pad(x, pad), k, s, d, oh, ow).sum(axis=0)
    if count_include_pad:
        return total / (k[0] * k[1])
    return total / _windows(np.pad(np.ones_like(x), pad), k, s, d, oh, ow).sum(axis=0)


def ref_batch_norm(x, gamma, beta, rmean, rvar, training=True, eps=1e-5):
    mean = x.mean(axis=(0, 2, 3)) if training else rmean
    var = x.var(axis=(0, 2, 3)) if training else rvar
    xhat = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + eps)
    return xhat * gamma[None, :, None, None] + beta[None, :, None, None]


def ref_global_avg(x, output_size=1):
    return x.mean(axis=(2, 3), keepdims=True)


def ref_sigmoid(x):
    return 1 / (1 + np.exp(-x))


def ref_leaky_relu(x, slope=0.01):
    return np.where(x > 0, x, slope * x)


# -------------------------------------------------------------------- cases
def conv_case(name, xshape, wshape, bias, **kw):
    inputs = [randn(name, *xshape), randn(name + "w", *wshape)] + ([randn(name + "b", wshape[0])] if bias else [])
    return OpCase(name, lambda *a: ops.conv2d(*a, **kw), inputs, lambda *a: ref_conv2d(*a, **kw),
                  torch=lambda F, *t: F.conv2d(*t, **kw))


def conv_t_case(name, xshape, wshape, bias, **kw):
    out = wshape[1] * kw.get("groups", 1)
    inputs = [randn(name, *xshape), randn(name + "w", *wshape)] + ([randn(name + "b", out)] if bias else [])
    return OpCase(name, lambda *a: ops.conv_transpose2d(*a, **kw), inputs,
                  lambda *a: ref_conv_transpose2d(*a, **kw), torch=lambda F, *t: F.conv_transpose2d(*t, **kw))


def pointwise_case(name, op, ref, torch_fn, shape, make=randn):
    return OpCase(name, op, [make(name, *shape)], ref, torch=torch_fn)


def pool_case(name, op, ref, torch_fn, shape, make=randn, **kw):
    return OpCase(name, lambda x: op(x, **kw), [make(name, *shape)], lambda x: ref(x, **kw),
                  torch=lambda F, x: getattr(F, torch_fn)(x, **kw))


def bn_case(name, shape, training, state=(3, 4), bugs=None):
    c = shape[1]
    r = rng_for(name, "stats")
    inputs = [randn(name, *shape) * 2 + 0.5, 1 + 0.2 * randn(name + "g", c), randn(name + "b", c),
              r.standard_normal(c), 0.5 + r.random(c)]
    return OpCase(name, lambda x, g, b, m, v: ops.batch_norm2d(x, g, b, m, v, training=training),
                  inputs, lambda x, g, b, m, v: ref_batch_norm(x, g, b, m, v, training), state=state,
                  torch=lambda F, x, g, b, m, v: F.batch_norm(x, m, v, g, b, training, 0.1, 1e-5),
                  bugs=bugs or {})


def torch_cat(tensors, dim):
    import torch
    return torch.cat(list(tensors), dim)


def same_value_twice(a):
    """x + x on a parameter and on an intermediate value: one gradient from two partials."""
    h = ops.sigmoid(a)
    return ops.add(ops.add(ops.tanh(a), ops.tanh(a)), ops.add(h, h))


def branches_cat(x, w):
    """A value read by two branches and also concatenated itself, twice."""
    h = ops.conv2d(x, w, padding=1)
    return ops.cat([ops.relu(h), h, ops.sigmoid(h), h])


def ref_branches_cat(x, w):
    h = ref_conv2d(x, w, padding=1)
    return np.concatenate([np.maximum(h, 0), h, ref_sigmoid(h), h], 1)


def torch_branches_cat(F, x, w):
    h = F.conv2d(x, w, padding=1)
    return torch_cat([F.relu(h), h, F.sigmoid(h), h], 1)


def fan_out(x, w1, w2):
    """One value read by three different ops whose results are summed."""
    h = ops.conv2d(x, w1, padding=1)
    return ops.add(ops.add(ops.relu(h), ops.tanh(h)), ops.conv2d(h, w2))


def ref_fan_out(x, w1, w2):
    h = ref_conv2d(x, w1, padding=1)
    return np.maximum(h, 0) + np.tanh(h) + ref_conv2d(h, w2)


def torch_fan_out(F, x, w1, w2):
    h = F.conv2d(x, w1, padding=1)
    return F.relu(h) + F.tanh(h) + F.conv2d(h, w2)


def ref_cross_entropy(z, labels):
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(labels)), labels].mean()


CASES = [
    conv_case("conv_s2_p1", (2, 3, 7, 6), (4, 3, 3, 3), True, stride=2, padding=1),
    conv_case("conv_p2_nobias", (2, 3, 5, 7), (5, 3, 3, 2), False, padding=(2, 1)),
    conv_case("conv_dil2", (1, 2, 9, 8), (3, 2, 3, 3), True, padding=2, dilation=2),
    conv_case("conv_groups2", (2, 4, 6, 5), (6, 2, 3, 3), True, stride=(1, 2), padding=1, groups=2),
    conv_case("conv_depthwise", (2, 3, 7, 7), (3, 1, 3, 3), False, stride=2, padding=1, groups=3),
    conv_case("conv_depthwise_x2", (1, 3, 5, 6), (6, 1, 3, 3), True, padding=1, groups=3),
    conv_case("conv_1x1", (3, 4, 5, 5), (2, 4, 1, 1), True),
    conv_case("conv_1x1_s2_nobias", (2, 3, 6, 7), (4, 3, 1, 1), False, stride=2),
    conv_case("conv_odd", (2, 3, 11, 9), (4, 3, 5, 3), True, stride=(3, 2), padding=(2, 1)),
    conv_t_case("convT_s2_p1_op1", (2, 3, 4, 5), (3, 4, 3, 3), True, stride=2, padding=1, output_padding=1),
    conv_t_case("convT_groups2", (2, 4, 3, 4), (4, 3, 3, 3), False, stride=2, padding=1, groups=2),
    conv_t_case("convT_plain", (1, 2, 3, 3), (2, 3, 2, 2), True),
    conv_t_case("convT_dil2", (1, 2, 3, 4), (2, 2, 3, 2), True, stride=2, output_padding=1, dilation=2),
    OpCase("linear", ops.linear, [randn("lin", 5, 7), randn("linw", 3, 7), randn("linb", 3)],
           lambda x, w, b: x @ w.T + b, torch=lambda F, *t: F.linear(*t)),
    OpCase("linear_nobias", ops.linear, [randn("linnb", 4, 6), randn("linnbw", 2, 6)],
           lambda x, w: x @ w.T, torch=lambda F, *t: F.linear(*t)),
    bn_case("batch_norm_train", (4, 3, 5, 6), True),
    bn_case("batch_norm_train_n1", (1, 2, 3, 3), True),
    bn_case("batch_norm_eval", (2, 3, 4, 3), False),
    bn_case("batch_norm_of_constant", (2, 3, 4, 4), True, state=(0, 3, 4)),   # BN on the network input
    pointwise_case("relu", ops.relu, lambda x: np.maximum(x, 0), lambda F, x: F.relu(x), (3, 4, 5),
                   away_from_zero),
    pointwise_case("leaky_relu", ops.leaky_relu, ref_leaky_relu, lambda F, x: F.leaky_relu(x), (2, 3, 4, 5),
                   away_from_zero),
    pointwise_case("leaky_relu_0.2", lambda x: ops.leaky_relu(x, 0.2), lambda x: ref_leaky_relu(x, 0.2),
                   lambda F, x: F.leaky_relu(x, 0.2), (7, 3), away_from_zero),
    pointwise_case("sigmoid", ops.sigmoid, ref_sigmoid, lambda F, x: F.sigmoid(x), (2, 3, 4, 5)),
    pointwise_case("tanh", ops.tanh, np.tanh, lambda F, x: F.tanh(x), (5, 2, 3)),
    pool_case("max_pool_k3_s2_p1", ops.max_pool2d, ref_max_pool2d, "max_pool2d", (2, 3, 7, 8), distinct,
              kernel_size=3, stride=2, padding=1),
    pool_case("max_pool_dil2", ops.max_pool2d, ref_max_pool2d, "max_pool2d", (1, 2, 9, 10), distinct,
              kernel_size=3, stride=2, padding=1, dilation=2),
    pool_case("max_pool_k2", ops.max_pool2d, ref_max_pool2d, "max_pool2d", (2, 2, 5, 6), distinct,
              kernel_size=2),
    pool_case("avg_pool_pad_incl", ops.avg_pool2d, ref_avg_pool2d, "avg_pool2d", (2, 3, 7, 6),
              kernel_size=3, stride=2, padding=1, count_include_pad=True),
    pool_case("avg_pool_pad_excl", ops.avg_pool2d, ref_avg_pool2d, "avg_pool2d", (2, 3, 7, 6),
              kernel_size=3, stride=2, padding=1, count_include_pad=False),
    pool_case("avg_pool_rect_excl", ops.avg_pool2d, ref_avg_pool2d, "avg_pool2d", (1, 2, 5, 7),
              kernel_size=(3, 2), stride=(1, 2), padding=(1, 1), count_include_pad=False),
    pool_case("adaptive_avg_pool", ops.adaptive_avg_pool2d, ref_global_avg,
              "adaptive_avg_pool2d", (2, 5, 3, 4), output_size=1),
    pool_case("adaptive_avg_pool_1x1", ops.adaptive_avg_pool2d, ref_global_avg,
              "adaptive_avg_pool2d", (3, 2, 1, 1), output_size=1),
    OpCase("add", ops.add, [randn("adda", 2, 3, 4), randn("addb", 2, 3, 4)], np.add,
           torch=lambda F, a, b: a + b),
    OpCase("add_same_param", lambda a: ops.add(a, a), [randn("addaa", 3, 5)], lambda a: a + a,
           torch=lambda F, a: a + a),
    OpCase("add_same_value", same_value_twice, [randn("addhh", 2, 4)], lambda a: 2 * np.tanh(a) + 2 * ref_sigmoid(a),
           torch=lambda F, a: F.tanh(a) + F.tanh(a) + 2 * F.sigmoid(a)),
    OpCase("cat3_dim1", lambda a, b, c: ops.cat([a, b, c], dim=1),
           [randn("cata", 2, 1, 4, 5), randn("catb", 2, 3, 4, 5), randn("catc", 2, 2, 4, 5)],
           lambda *a: np.concatenate(a, axis=1), torch=lambda F, *t: torch_cat(t, 1)),
    OpCase("cat_branches", branches_cat, [randn("catbr", 2, 2, 4, 3), randn("catbrw", 3, 2, 3, 3)],
           ref_branches_cat, torch=torch_branches_cat),
    OpCase("cat_last_dim", lambda a, b: ops.cat([a, b], dim=-1), [randn("catl", 2, 3, 2), randn("catm", 2, 3, 4)],
           lambda a, b: np.concatenate([a, b], -1), torch=lambda F, a, b: torch_cat([a, b], -1)),
    OpCase("cat_with_constant", lambda c, a: ops.cat([c, ops.tanh(a)], dim=1),
           [randn("catk", 2, 2, 3), randn("catka", 2, 3, 3)], lambda c, a: np.concatenate([c, np.tanh(a)], 1),
           state=(0,), torch=lambda F, c, a: torch_cat([c, F.tanh(a)], 1)),
    OpCase("flatten", lambda x: ops.flatten(ops.tanh(x)), [randn("flat", 2, 3, 4, 5)],
           lambda x: np.tanh(x).reshape(2, -1), torch=lambda F, x: F.tanh(x).flatten(1)),
    OpCase("flatten_start2", lambda x: ops.flatten(x, 2), [randn("flat2", 2, 3, 2, 5)],
           lambda x: x.reshape(2, 3, 10), torch=lambda F, x: x.flatten(2)),
    OpCase("reshape_linear", lambda x, w: ops.linear(ops.reshape(x, (6, 10)), w),
           [randn("resh", 3, 4, 5), randn("reshw", 2, 10)], lambda x, w: x.reshape(6, 10) @ w.T,
           torch=lambda F, x, w: F.linear(x.reshape(6, 10), w)),
    OpCase("cross_entropy", lambda z: z, [randn("ce", 6, 5) * 2], lambda z: z,   # the logits go straight in
           loss="ce", labels=np.array([0, 4, 2, 2, 1, 3]), torch=lambda F, z: z),
    OpCase("cross_entropy_linear", ops.linear, [randn("cel", 4, 7), randn("celw", 3, 7), randn("celb", 3)],
           lambda x, w, b: x @ w.T + b, loss="ce", labels=np.array([2, 0, 1, 2]),
           torch=lambda F, *t: F.linear(*t)),
    OpCase("cross_entropy_not_last", ops.cross_entropy, [randn("cenl", 4, 3), np.array([0, 1, 2, 1])],
           lambda z, l: ref_cross_entropy(z, l), state=(1,), torch=lambda F, z, l: F.cross_entropy(z, l)),
    OpCase("mse_loss_4d", lambda p: p, [randn("mse", 2, 3, 2, 5)], lambda p: p, torch=lambda F, p: p),
    OpCase("fan_out", fan_out, [randn("fan", 2, 2, 5, 4), randn("fanw1", 3, 2, 3, 3), randn("fanw2", 3, 3, 1, 1)],
           ref_fan_out, torch=torch_fan_out),
]


@pytest.mark.parametrize("case", [c.param("forward") for c in CASES])
@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
def test_forward(case, dtype, device):
    check_forward(case, dtype, device)


@pytest.mark.parametrize("case", [c.param("backward") for c in CASES])
def test_backward(case, device):
    check_backward(case, device)


@pytest.mark.parametrize("case", [c.param("torch") for c in CASES if c.torch is not None])
def test_against_torch(case, device):
    check_torch(case, device)


# ------------------------------------------------- BatchNorm running statistics
def _bn_after_one_step(device="cpu"):
    case = bn_case("batch_norm_running", (3, 4, 5, 2), True)
    trainer, net = compile_case(case, device=device)
    trainer.step(DUMMY, case.target())
    return case, net.holders()


def test_batch_norm_running_stats(device):
    case, h = _bn_after_one_step(device)
    x, _, _, rm, rv = case.inputs
    mom = 0.1
    np.testing.assert_allclose(host(h[3].data), (1 - mom) * rm + mom * x.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(host(h[4].data), (1 - mom) * rv + mom * x.var(axis=(0, 2, 3), ddof=1), rtol=1e-12)


def test_batch_norm_running_stats_against_torch():
    torch = pytest.importorskip("torch")
    case, h = _bn_after_one_step()
    x, g, b, rm, rv = (torch.tensor(a) for a in case.inputs)
    torch.nn.functional.batch_norm(x, rm, rv, g, b, training=True, momentum=0.1, eps=1e-5)
    np.testing.assert_allclose(h[3].data, rm.numpy(), rtol=1e-12)
    np.testing.assert_allclose(h[4].data, rv.numpy(), rtol=1e-12)


# ------------------------------------------------------------------- dropout
P_DROP = 0.3


def dropout_case(name="dropout"):
    x = 0.5 + rng_for(name).random((4, 5, 6, 7))            # positive, so 0 in the output means dropped
    return OpCase(name, lambda x: ops.dropout(x, P_DROP), [x], lambda x: x)


def test_dropout_forward_mask(device):
    case = dropout_case()
    trainer, _ = compile_case(case, device=device)
    x = case.inputs[0]
    out = trainer.predict(DUMMY)
    kept = out != 0
    np.testing.assert_allclose(out[kept], x[kept] / (1 - P_DROP), rtol=1e-15)
    frac = 1 - kept.mean()                                   # 840 draws: std of the fraction ~0.016
    assert abs(frac - P_DROP) < 0.06, f"dropped fraction {frac}, expected about {P_DROP}"


def test_dropout_backward_uses_the_forward_mask(device):
    case = dropout_case()
    trainer, net = compile_case(case, device=device)
    x, t = case.inputs[0], case.target()
    loss = trainer.step(DUMMY, t)
    grad = host(net.holders()[0].grad)
    mask = grad != 0                                          # kept elements have a nonzero gradient
    y = mask * x / (1 - P_DROP)
    assert 0 < mask.mean() < 1
    np.testing.assert_allclose(loss, np.mean((y - t) ** 2), rtol=1e-12)
    upstream = 2 * (y - t) / y.size
    np.testing.assert_allclose(grad, mask / (1 - P_DROP) * upstream, rtol=1e-12, atol=1e-15)


def test_dropout_masks_follow_the_seed(device):
    case = dropout_case()
    a, b, c = (compile_case(case, seed=s, device=device)[0] for s in (7, 7, 8))
    first = a.predict(DUMMY)
    np.testing.assert_array_equal(first, b.predict(DUMMY))
    np.testing.assert_array_equal(a.predict(DUMMY) != 0, b.predict(DUMMY) != 0)
    assert not np.array_equal(first != 0, c.predict(DUMMY) != 0), "another seed gave the same mask"
    assert not np.array_equal(first != 0, a.predict(DUMMY) != 0), "successive runs reused the mask"
