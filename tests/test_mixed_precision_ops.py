"""Every op in bfloat16 and float16 against the same op in float32 (issue #27, CPU), forward and gradients.

Each op runs outside a graph (harness.run_op) as mixed precision runs it (minidnn.autocast): the
elementwise, pooling, BatchNorm, dropout, interpolation and copy ops on low-precision activations
(staged: exact widening to fp32, the op's fp32 kernel, one rounding of each result; reshape and
slice copy the low values themselves), convolutions and linear layers on low activations *and*
weights, and the fp32 ops (losses, LayerNorm, GroupNorm) on low inputs widened exactly to fp32.

Two bounds, both from the dtype's unit roundoff u = eps/2 (round to nearest even: bf16 2^-8,
fp16 2^-11) and, where the op sums, its reduction length K:

1. **Against the fp32 op on the same (already rounded) inputs, forward and gradients:** the
   widening is exact and the fp32 kernel is the same kernel, summing in the same order, so the
   only difference is the one rounding of each result: the low result is *exactly* the fp32
   result rounded to the low dtype (asserted bitwise), hence within u |y| + t of it. For the
   gradients the upstream gradient gy is itself a low value, fed to both, and an op whose backward
   reads its own output (sigmoid, tanh) reads it as stored, rounded to the low dtype, in both.
2. **Against the fp32 op on the raw (unrounded) fp32 inputs, forward:** rounding each rounded
   input moves it by at most u |x|; the op carries that to its output by at most u S, where S is
   the op's sensitivity, derived per op below (|f'| |x| for a pointwise f; |a| + |b| for a sum;
   the largest |x| for copies, max and averages, which are convex combinations; 2 K max|x| max|w|
   for a K-term dot product whose two factors are both rounded; for a normalization, the
   derivation at ``_norm_sensitivity``). With the final rounding (u |y|) and fp32's own
   evaluation error on both sides (at most K eps32 S_32, S_32 = the same sensitivity at
   eps32 = 2^-23 in place of u, for a K-term sum) the bound is
   |y_low - y_raw| <= u |y_raw| (1 + u) + u S + 2 K eps32 S + t.
   In the subnormal range a rounding errs by up to half the subnormals' spacing instead of u |y|
   (fp16: 2^-25; bf16: 2^-134), added to every bound as t. These are first-order bounds; the
   neglected terms are O(u^2) relative (< 1% at u = 2^-8), covered by the factor 1.02 on u S.
"""
import numpy as np
import pytest

from harness import rng_for, run_op
from minidnn.autocast import FP32_OPS, LOW_OPS, NATIVE_OPS
from minidnn.ops.activation import GELUOp, LeakyReLUOp, ReLUOp, SigmoidOp, SiLUOp, TanhOp
from minidnn.ops.conv import Conv2dOp, ConvTranspose2dOp
from minidnn.ops.dropout import DropoutOp
from minidnn.ops.elementwise import AddOp, CatOp, ReshapeOp, ScalarAffineOp
from minidnn.ops.index import SliceOp
from minidnn.ops.interpolate import InterpolateOp
from minidnn.ops.linear import LinearOp
from minidnn.ops.loss import CrossEntropyOp, MSEOp
from minidnn.ops.norm import BatchNorm2dOp
from minidnn.ops.pool import (AdaptiveAvgPool2dOp, AdaptiveMaxPool2dOp, AvgPool2dOp, GlobalAvgPoolOp,
                              MaxPool2dOp)
from minidnn.ops.sample_norm import GroupNormOp, LayerNormOp
from minidnn.ops.staging import staged
from minidnn.precision import BF16, FP16, FP32

U = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
LOW = {"bf16": BF16, "fp16": FP16}
TINY = {"bf16": 2.0 ** -134, "fp16": 2.0 ** -25}     # half the spacing of the subnormals
EPS32 = 2.0 ** -23


def m(a):
    return float(np.max(np.abs(a)))


def _norm_sensitivity(x, gamma, axes, eps=1e-5):
    """S of y = gamma (x - mean) / sigma + beta over ``axes``, x perturbed by |d| <= u |x| <= u M (M = max|x|):
    the mean moves by <= u M, so each centred value c by <= 2 u M; sigma = ||(c, sqrt(eps))|| / sqrt(n) is
    1-Lipschitz in the RMS of c, so it moves by <= 2 u M; y - beta = gamma c / sigma moves by
    <= |gamma| (2 u M / sigma + |c / sigma| 2 u M / sigma) = 2 u M |gamma| (1 + |x_hat|) / sigma.
    Here sigma is the smaller of the two runs' (the rounded inputs' one differs by O(u))."""
    x = x.astype(np.float64)
    c = x - x.mean(axis=axes, keepdims=True)
    sigma = np.sqrt((c ** 2).mean(axis=axes, keepdims=True) + eps) * (1 - 4 * U["bf16"])
    return 2 * m(x) * np.abs(gamma) * (1 + np.abs(c) / sigma) / sigma


def randn(key, *shape, scale=1.0):
    return (rng_for("mp-ops", key).standard_normal(shape) * scale).astype(np.float32)


def chan(v):
    return v.reshape(1, -1, 1, 1)


# name: (op factory, inputs, the positions rounded to the low dtype, sensitivity S(raw inputs), K)
# The rounded positions are what autocast makes low: activations everywhere, weights for
# conv/linear; BatchNorm's affine parameters and statistics stay fp32.
X = randn("x", 2, 3, 6, 6)
CASES = {
    "relu": (ReLUOp, [X], (0,), lambda x: np.abs(x), 1),
    "leaky_relu": (lambda: LeakyReLUOp(0.1), [X], (0,), lambda x: np.abs(x), 1),
    "gelu": (GELUOp, [X], (0,), lambda x: 1.13 * np.abs(x), 1),          # max |gelu'| = 1.129
    "gelu_tanh": (lambda: GELUOp("tanh"), [X], (0,), lambda x: 1.13 * np.abs(x), 1),
    "silu": (SiLUOp, [X], (0,), lambda x: 1.1 * np.abs(x), 1),           # max |silu'| = 1.0998
    "sigmoid": (SigmoidOp, [X], (0,), lambda x: 0.25 * np.abs(x), 1),
    "tanh": (TanhOp, [X], (0,), lambda x: np.abs(x), 1),
    "add": (AddOp, [X, randn("b", 2, 3, 6, 6)], (0, 1), lambda a, b: np.abs(a) + np.abs(b), 1),
    "scalar_affine": (lambda: ScalarAffineOp(-3.0, 0.5), [X], (0,), lambda x: 3 * np.abs(x), 1),
    "max_pool": (lambda: MaxPool2dOp(2), [X], (0,), lambda x: m(x), 1),
    "max_pool_3s2p1": (lambda: MaxPool2dOp(3, 2, 1), [X], (0,), lambda x: m(x), 1),
    "avg_pool": (lambda: AvgPool2dOp(2), [X], (0,), lambda x: m(x), 4),
    "avg_pool_3s2p1": (lambda: AvgPool2dOp(3, 2, 1), [X], (0,), lambda x: m(x), 9),
    "global_avg_pool": (GlobalAvgPoolOp, [X], (0,), lambda x: m(x), 36),
    "adaptive_avg_pool": (lambda: AdaptiveAvgPool2dOp((4, 5)), [X], (0,), lambda x: m(x), 4),
    "adaptive_max_pool": (lambda: AdaptiveMaxPool2dOp((4, 5)), [X], (0,), lambda x: m(x), 1),
    "batch_norm_train": (BatchNorm2dOp, [X * 3 + 1, randn("g", 3) + 1, randn("be", 3), np.zeros(3, np.float32),
                                         np.ones(3, np.float32)], (0,),
                         lambda x, g, b, rm, rv: _norm_sensitivity(x, chan(g), (0, 2, 3)), 72),
    "batch_norm_eval": (lambda: BatchNorm2dOp(training=False),
                        [X * 3 + 1, randn("g2", 3) + 1, randn("be2", 3), randn("rm", 3),
                         np.abs(randn("rv", 3)) + 0.5], (0,),
                        lambda x, g, b, rm, rv: np.abs(chan(g)) * np.abs(x) / np.sqrt(chan(rv) + 1e-5), 1),
    "dropout": (lambda: DropoutOp(0.25), [X], (0,), lambda x: m(x) / 0.75, 1),
    "interpolate_nearest": (lambda: InterpolateOp(scale_factor=2), [X], (0,), lambda x: m(x), 1),
    "interpolate_bilinear": (lambda: InterpolateOp(size=(9, 7), mode="bilinear", align_corners=False), [X], (0,),
                             lambda x: m(x), 4),
    "cat": (lambda: CatOp(1), [X, randn("c", 2, 2, 6, 6)], (0, 1), lambda a, b: max(m(a), m(b)), 1),
    "reshape": (lambda: ReshapeOp((2, -1)), [X], (0,), lambda x: m(x), 1),
    "slice": (lambda: SliceOp([slice(None), slice(1, 3), slice(None, None, 2), slice(None)]), [X], (0,),
              lambda x: m(x), 1),
    "linear": (LinearOp, [randn("lx", 4, 16), randn("lw", 5, 16, scale=0.3), randn("lb", 5)], (0, 1, 2),
               lambda x, w, b: 2 * 16 * m(x) * m(w) + np.abs(b), 16),
    "conv2d": (lambda: Conv2dOp(padding=1), [X, randn("w", 4, 3, 3, 3, scale=0.3), randn("cb", 4)], (0, 1, 2),
               lambda x, w, b: 2 * 27 * m(x) * m(w) + np.abs(chan(b)), 27),
    "conv2d_s2_groups": (lambda: Conv2dOp(stride=2, padding=1, groups=3), [X, randn("wg", 3, 1, 3, 3, scale=0.3)],
                         (0, 1), lambda x, w: 2 * 9 * m(x) * m(w), 9),
    "conv_transpose2d": (lambda: ConvTranspose2dOp(stride=2, padding=1), [X, randn("wt", 3, 2, 3, 3, scale=0.3)],
                         (0, 1), lambda x, w: 2 * 27 * m(x) * m(w), 27),
    # fp32 ops: the low inputs widened (exact), the fp32 kernel, an fp32 result
    "layer_norm": (lambda: LayerNormOp((6, 6)), [X * 2 - 1, randn("lnw", 6, 6) + 1, randn("lnb", 6, 6)], (0,),
                   lambda x, w, b: _norm_sensitivity(x, w, (2, 3)), 36),
    "group_norm": (lambda: GroupNormOp(3), [X * 2 - 1, randn("gnw", 3) + 1, randn("gnb", 3)], (0,),
                   lambda x, w, b: _norm_sensitivity(x, chan(w), (2, 3)), 36),
    # cross entropy: |d loss / d z_ij| summed over a row is <= 2 / N, so a move of <= u max|z| per logit
    # moves the mean loss by <= 2 u max|z|
    "cross_entropy": (CrossEntropyOp, [randn("z", 6, 5, scale=2), np.array([0, 1, 2, 3, 4, 0])], (0,),
                      lambda z, t: 2 * m(z), 5),
    # mse: L = mean (p - t)^2 moves by <= mean 2 |p - t| (u |p| + u |t|) (both rounded)
    "mse": (MSEOp, [randn("p", 3, 4), randn("t", 3, 4)], (0, 1),
            lambda p, t: 2 * np.mean(np.abs(p - t) * (np.abs(p) + np.abs(t))), 12),
}


def low_variant(op, low_inputs):
    """``op`` as mixed precision runs it on ``low_inputs``: natively (copies), or staged."""
    if op.name in FP32_OPS or op.name in NATIVE_OPS or not any(a.dtype != FP32 for a in low_inputs
                                                               if a.dtype.kind in "fV"):
        return op
    return staged(op)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", list(CASES))
def test_op_in_low_precision_against_its_fp32_result(name, precision):
    make, raw, rounded, sensitivity, k = CASES[name]
    low, u, tiny = LOW[precision], U[precision], TINY[precision]
    fp32_op = make().name in FP32_OPS
    # the op's inputs as mixed precision hands them over: rounded positions low (or, for an fp32 op,
    # low values widened back), the others as they are
    lows = [a.astype(low) if i in rounded else a for i, a in enumerate(raw)]
    if fp32_op:
        lows = [a.astype(FP32) if i in rounded else a for i, a in enumerate(lows)]
    wide = [a.astype(FP32) if i in rounded else a for i, a in enumerate(lows)]    # the same values, fp32

    (y32, *_), _ = run_op(make(), wide)
    gy_low = rng_for("mp-ops", name, "gy").standard_normal(y32.shape).astype(np.float32).astype(low)
    gy_in = gy_low.astype(FP32) if fp32_op else gy_low
    # the backward reads saved outputs as the low run stores them (an activation's low output; BatchNorm's
    # fp32 statistics are fp32 in both)
    saved_low = [i for i in make().saved_outputs if i == 0]
    (y32, *rest32), g32 = run_op(make(), wide, gy_low.astype(FP32), saved_as=low if saved_low and not fp32_op else None)
    op = low_variant(make(), lows)
    (ylow, *restlow), glow = run_op(op, lows, gy_in)
    out_dtype = FP32 if fp32_op else low
    assert ylow.dtype == out_dtype

    # 1. bitwise the fp32 result rounded once (so within u |y|), forward, extra outputs and gradients
    assert np.array_equal(ylow, y32.astype(out_dtype), equal_nan=True), name
    for j, (a, b) in enumerate(zip(restlow, rest32), 1):   # BatchNorm's statistics stay fp32; dropout's mask
        if j in op.saved_outputs:                          # is the same
            assert a.dtype == b.dtype and np.array_equal(a, b), name
    checked = 0
    for i, (a, b) in enumerate(zip(glow, g32)):
        if a is None:
            continue
        want = b.astype(a.dtype)
        assert a.dtype == (lows[i].dtype), (name, i)
        assert np.array_equal(a, want), (name, i, np.abs(a.astype(np.float64) - b).max())
        assert np.all(np.abs(a.astype(np.float64) - b) <= u * np.abs(b) + tiny), (name, i)
        checked += 1
    assert checked >= 1

    # 2. against the raw fp32 inputs, within the derived bound
    (yraw, *_), _ = run_op(make(), raw)
    s = np.broadcast_to(np.asarray(sensitivity(*[a.astype(np.float64) if a.dtype.kind == "f" else a
                                                 for a in raw]), np.float64), np.shape(yraw))
    if name == "dropout":
        s = s * (yraw != 0)                       # the same mask: dropped elements are 0 on both sides
    bound = u * np.abs(yraw) * (1 + u) + 1.02 * u * s + 2 * k * EPS32 * s + tiny
    err = np.abs(ylow.astype(np.float64) - yraw)
    assert np.all(err <= bound), (name, float((err / np.maximum(bound, 1e-30)).max()))
    assert np.any(err > 0) or name in ("relu", "max_pool", "reshape", "slice", "cat")   # the check sees something


def test_every_op_module_has_a_low_precision_case():
    """Each op class in minidnn/ops that mixed precision runs (not the sub-batch and fused BatchNorm
    variants, which staging leaves out, nor the graph's own cast) has a case above."""
    covered = {type(f()).__name__ for f, *_ in CASES.values()}
    wanted = {"ReLUOp", "LeakyReLUOp", "GELUOp", "SiLUOp", "SigmoidOp", "TanhOp", "AddOp", "ScalarAffineOp",
              "MaxPool2dOp", "AvgPool2dOp", "GlobalAvgPoolOp", "AdaptiveAvgPool2dOp", "AdaptiveMaxPool2dOp",
              "BatchNorm2dOp", "DropoutOp", "InterpolateOp", "CatOp", "ReshapeOp", "SliceOp", "LinearOp",
              "Conv2dOp", "ConvTranspose2dOp", "LayerNormOp", "GroupNormOp", "CrossEntropyOp", "MSEOp"}
    assert wanted <= covered
    assert {"conv2d", "conv_transpose2d", "linear"} == set(LOW_OPS)
