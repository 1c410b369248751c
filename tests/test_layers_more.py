"""GELU, SiLU, LayerNorm, GroupNorm, BatchNorm1d and interpolate (issue #31 item 10), op by op.

Each op runs through the shared harness (harness.py): forward in float64 and float32 against a
NumPy reference written here, gradients against float64 central differences, and forward and
gradients against ``torch.nn.functional`` in float64. The layers' parameters, state_dicts and
whole-network agreement with PyTorch are in test_layers_more_torch.py.
"""
import math
import re

import numpy as np
import pytest

from harness import DUMMY, FnModule, OpCase, compile_case, host, op_tests, rng_for
from minidnn import nn as mnn
from minidnn import ops
from minidnn.errors import ShapeError
from minidnn.graph import trace
from minidnn.ops.activation import GELUOp, SiLUOp
from minidnn.ops.interpolate import InterpolateOp
from minidnn.ops.sample_norm import GroupNormOp, LayerNormOp


def randn(name, *shape):
    return rng_for(name, shape).standard_normal(shape)


# ----------------------------------------------------------- NumPy references
_erf = np.vectorize(math.erf)


def ref_gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def ref_silu(x):
    return x / (1 + np.exp(-x))


def _normalize(x, axes, eps):
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps)


def ref_layer_norm(x, k, w=None, b=None, eps=1e-5):
    y = _normalize(x, tuple(range(x.ndim - k, x.ndim)), eps)
    y = y * w if w is not None else y
    return y + b if b is not None else y


def ref_group_norm(x, groups, w=None, b=None, eps=1e-5):
    n, c = x.shape[:2]
    y = _normalize(x.reshape(n, groups, -1), (2,), eps).reshape(x.shape)
    per_channel = (1, c) + (1,) * (x.ndim - 2)
    y = y * w.reshape(per_channel) if w is not None else y
    return y + b.reshape(per_channel) if b is not None else y


def ref_batch_norm1d(x, g, b, rm, rv, training=True, eps=1e-5):
    axes = (0,) if x.ndim == 2 else (0, 2)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean = x.mean(axis=axes) if training else rm
    var = x.var(axis=axes) if training else rv
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * g.reshape(shape) + b.reshape(shape)


def _sources(n_in, n_out, mode, align_corners, scale):
    """Per output position: ((input index, weight), ...) following PyTorch's documented rules."""
    if mode == "nearest":
        if n_out == n_in:
            return [((i, 1.0),) for i in range(n_out)]
        if n_out == 2 * n_in:
            return [((i // 2, 1.0),) for i in range(n_out)]
        s = np.float32(1 / scale) if scale else np.float32(n_in) / np.float32(n_out)
        return [((min(int(np.floor(np.float32(i) * s)), n_in - 1), 1.0),) for i in range(n_out)]
    if n_out == n_in:
        return [((i, 1.0),) for i in range(n_out)]
    out = []
    for i in range(n_out):
        if align_corners:
            src = i * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            src = max((i + 0.5) * (1 / scale if scale else n_in / n_out) - 0.5, 0.0)
        i0 = min(int(math.floor(src)), n_in - 1)
        lam = min(max(src - i0, 0.0), 1.0)
        out.append(((i0, 1 - lam), (min(i0 + 1, n_in - 1), lam)))
    return out


def ref_interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=False, recompute=False):
    n, c, h, w = x.shape
    sf = (scale_factor, scale_factor) if np.isscalar(scale_factor) else scale_factor
    if size is not None:
        oh, ow = (size, size) if np.isscalar(size) else size
        scales = (None, None)
    else:
        oh, ow = math.floor(h * sf[0]), math.floor(w * sf[1])
        scales = (None, None) if recompute else sf
    rows = _sources(h, oh, mode, align_corners, scales[0])
    cols = _sources(w, ow, mode, align_corners, scales[1])
    y = np.zeros((n, c, oh, ow))
    for i, r in enumerate(rows):
        for j, q in enumerate(cols):
            for ri, rw in r:
                for ci, cw in q:
                    y[:, :, i, j] += rw * cw * x[:, :, ri, ci]
    return y


# ------------------------------------------------------------------ the cases
def gelu_case(name, approximate, shape=(2, 3, 4, 5)):
    x = 3 * randn(name, *shape)
    return OpCase(name, lambda x: ops.gelu(x, approximate), [x], lambda x: ref_gelu(x, approximate),
                  torch=lambda F, x: F.gelu(x, approximate=approximate))


def layer_norm_case(name, shape, k, affine="both"):
    rng = rng_for(name)
    x = 2 + 3 * rng.standard_normal(shape)
    norm = shape[len(shape) - k:]
    w = 1 + 0.5 * rng.standard_normal(norm) if affine in ("both", "weight") else None
    b = rng.standard_normal(norm) if affine == "both" else None
    inputs = [x] + [p for p in (w, b) if p is not None]

    def split(args):
        rest = list(args[1:])
        return args[0], rest.pop(0) if w is not None else None, rest.pop(0) if b is not None else None

    return OpCase(name, lambda *a: ops.layer_norm(split(a)[0], norm, *split(a)[1:]), inputs,
                  lambda *a: ref_layer_norm(split(a)[0], k, *split(a)[1:]),
                  torch=lambda F, *a: F.layer_norm(split(a)[0], norm, *split(a)[1:]))


def group_norm_case(name, shape, groups, affine=True):
    rng = rng_for(name)
    x = 1 + 2 * rng.standard_normal(shape)
    c = shape[1]
    params = [1 + 0.5 * rng.standard_normal(c), rng.standard_normal(c)] if affine else []
    return OpCase(name, lambda x, *p: ops.group_norm(x, groups, *p), [x] + params,
                  lambda x, *p: ref_group_norm(x, groups, *p),
                  torch=lambda F, x, *p: F.group_norm(x, groups, *p))


def bn1d_case(name, shape, training):
    rng = rng_for(name)
    c = shape[1]
    inputs = [2 + 3 * rng.standard_normal(shape), 1 + 0.5 * rng.standard_normal(c), rng.standard_normal(c),
              rng.standard_normal(c), 0.5 + rng.random(c)]
    return OpCase(name, lambda x, g, b, m, v: ops.batch_norm1d(x, g, b, m, v, training=training), inputs,
                  lambda x, g, b, m, v: ref_batch_norm1d(x, g, b, m, v, training), state=(3, 4),
                  torch=lambda F, x, g, b, m, v: F.batch_norm(x, m, v, g, b, training, 0.1, 1e-5))


def interp_case(name, shape, **kw):
    x = randn(name, *shape)
    recompute = kw.get("recompute_scale_factor", False)
    ref_kw = {k: v for k, v in kw.items() if k != "recompute_scale_factor"}
    ref_kw["align_corners"] = bool(ref_kw.get("align_corners"))
    return OpCase(name, lambda x: ops.interpolate(x, **kw), [x],
                  lambda x: ref_interpolate(x, recompute=recompute, **ref_kw),
                  torch=lambda F, x: F.interpolate(x, **kw))


CASES = [
    gelu_case("gelu", "none"),
    gelu_case("gelu_tanh", "tanh"),
    OpCase("silu", ops.silu, [4 * randn("silu", 3, 4, 5)], ref_silu, torch=lambda F, x: F.silu(x)),
    layer_norm_case("layer_norm_last", (3, 4, 6), 1),
    layer_norm_case("layer_norm_last2", (2, 3, 4, 5), 2),
    layer_norm_case("layer_norm_no_affine", (4, 7), 1, affine=None),
    layer_norm_case("layer_norm_no_bias", (3, 2, 5), 1, affine="weight"),
    group_norm_case("group_norm_4d", (3, 6, 4, 3), 3),
    group_norm_case("group_norm_3d", (2, 8, 5), 4),
    group_norm_case("group_norm_one_group", (2, 4, 3, 3), 1),
    group_norm_case("group_norm_per_channel", (2, 4, 3, 2), 4),
    group_norm_case("group_norm_no_affine", (3, 4, 2, 5), 2, affine=False),
    bn1d_case("batch_norm1d_nc_train", (6, 5), True),
    bn1d_case("batch_norm1d_ncl_train", (3, 4, 5), True),
    bn1d_case("batch_norm1d_nc_eval", (4, 3), False),
    bn1d_case("batch_norm1d_ncl_eval", (2, 3, 4), False),
    interp_case("nearest_x2", (2, 3, 4, 5), scale_factor=2),
    interp_case("nearest_size", (2, 2, 5, 4), size=(7, 3)),
    interp_case("nearest_x1.7", (2, 2, 5, 4), scale_factor=1.7),       # 1/1.7, not 5/8, places the sources
    interp_case("nearest_down", (1, 2, 7, 9), scale_factor=(0.5, 0.37)),
    interp_case("nearest_same_size", (1, 2, 3, 3), scale_factor=1.2),        # out == in: the identity
    interp_case("nearest_double", (1, 2, 3, 3), scale_factor=2.2),           # out == 2 in: dst // 2
    interp_case("nearest_rows_kept", (2, 2, 4, 3), size=(4, 7)),
    interp_case("nearest_recompute", (2, 2, 5, 4), scale_factor=1.7, recompute_scale_factor=True),
    interp_case("bilinear_x2", (2, 3, 4, 5), scale_factor=2, mode="bilinear"),
    interp_case("bilinear_size", (2, 2, 5, 4), size=(7, 3), mode="bilinear"),
    interp_case("bilinear_x1.5", (2, 2, 5, 4), scale_factor=1.5, mode="bilinear", align_corners=False),
    interp_case("bilinear_down", (1, 2, 7, 9), scale_factor=(0.6, 0.4), mode="bilinear"),
    interp_case("bilinear_corners_size", (2, 2, 4, 5), size=(7, 9), mode="bilinear", align_corners=True),
    interp_case("bilinear_corners_x2", (1, 3, 3, 4), scale_factor=2, mode="bilinear", align_corners=True),
    interp_case("bilinear_corners_to_1", (1, 2, 4, 5), size=(1, 3), mode="bilinear", align_corners=True),
    interp_case("bilinear_columns_kept", (2, 2, 3, 4), size=(6, 4), mode="bilinear"),
    interp_case("bilinear_recompute", (2, 2, 5, 4), scale_factor=1.5, mode="bilinear",
                recompute_scale_factor=True),
]


test_forward, test_finite_differences, test_against_torch = op_tests(CASES)


def test_retained_values():
    """What each backward keeps alive, as the planner sees it."""
    gelu, silu = GELUOp(), SiLUOp()
    assert (gelu.saved_inputs, gelu.saved_outputs, silu.saved_inputs, silu.saved_outputs) == ((0,), (), (0,), ())
    ln = LayerNormOp((4,))
    assert (ln.saved_inputs, ln.saved_outputs) == ((0, 1), (1, 2))            # x, weight; mean, invstd
    gn = GroupNormOp(2, has_weight=False, has_bias=False)
    assert (gn.saved_inputs, gn.saved_outputs) == ((0,), (1, 2))
    up = InterpolateOp(scale_factor=2)
    assert (up.saved_inputs, up.saved_outputs) == ((), ())                    # shapes only


def test_batch_norm1d_running_stats_against_torch():
    torch = pytest.importorskip("torch")
    for shape in [(6, 5), (3, 4, 5)]:
        case = bn1d_case(f"bn1d_running{shape}", shape, True)
        trainer, net = compile_case(case)
        trainer.step(DUMMY, case.target())
        h = net.holders()
        x, g, b, rm, rv = (torch.tensor(a) for a in case.inputs)
        torch.nn.functional.batch_norm(x, rm, rv, g, b, training=True, momentum=0.1, eps=1e-5)
        np.testing.assert_allclose(host(h[3].data), rm.numpy(), rtol=1e-12)
        np.testing.assert_allclose(host(h[4].data), rv.numpy(), rtol=1e-12)


# ------------------------------------------------------- errors at capture and construction
@pytest.mark.parametrize("layer, shape, what", [
    (lambda: mnn.LayerNorm(5), (2, 3, 4), "(layer_norm): expected an input of shape (*, 5) (normalized_shape [5])"),
    (lambda: mnn.LayerNorm([3, 5]), (2, 3, 4), "expected an input of shape (*, 3, 5)"),
    (lambda: mnn.GroupNorm(2, 4), (2, 3, 4, 4), "(group_norm): expected 4 channels, got 3"),
    (lambda: mnn.GroupNorm(2, 4, affine=False), (2, 3, 4, 4), "3 channels cannot be split into 2 groups"),
    (lambda: mnn.GroupNorm(1, 4), (2,), "expected an input of shape (N, C, *), got 1-D"),
    (lambda: mnn.BatchNorm1d(3), (2, 3, 4, 4), "(batch_norm1d): expected a 2-D (N, C) or 3-D (N, C, L) input, got 4-D"),
    (lambda: mnn.BatchNorm1d(4), (2, 3), "(batch_norm1d): expected 4 channels, got 3"),
    (lambda: mnn.BatchNorm1d(3), (1, 3), "expected more than 1 value per channel when training"),
    (lambda: mnn.Upsample(scale_factor=2), (2, 3, 4), "(upsample_nearest): expected a 4-D input (N, C, H, W)"),
    (lambda: mnn.Upsample(scale_factor=0.2), (2, 3, 4, 4), "the output size (0, 0) of a 4x4 input must be positive"),
    (lambda: FnModule(lambda x: mnn.functional.interpolate(x, size=3, scale_factor=2)), (2, 3, 4, 4),
     "exactly one of size and scale_factor must be given"),
    (lambda: FnModule(lambda x: mnn.functional.interpolate(x, scale_factor=2, mode="nearest", align_corners=True)),
     (2, 3, 4, 4), "align_corners option can only be set with the interpolating modes"),
    (lambda: FnModule(lambda x: mnn.functional.interpolate(x, size=(3, 0))), (2, 3, 4, 4), "size must be a positive"),
], ids=["ln", "ln2", "gn_channels", "gn_groups", "gn_1d", "bn1d_4d", "bn1d_channels", "bn1d_one_value",
        "upsample_3d", "upsample_empty", "both_sizes", "nearest_corners", "zero_size"])
def test_bad_shapes_name_the_layer(layer, shape, what):
    net = mnn.Sequential(mnn.Identity(), mnn.Sequential(layer()))
    with pytest.raises(ShapeError) as ei:
        trace(net, shape)
    msg = str(ei.value)
    assert msg.startswith("1.0 ("), msg
    assert what in msg and str(shape) in msg, msg


@pytest.mark.parametrize("make, what", [
    (lambda: mnn.GroupNorm(3, 4), "num_channels (4) must be divisible by num_groups (3)"),
    (lambda: mnn.GELU("erf"), "approximate must be 'none' or 'tanh'"),
    (lambda: mnn.Upsample(scale_factor=2, mode="bicubic"), "mode 'bicubic' is not supported"),
    (lambda: mnn.Upsample(), "exactly one of size and scale_factor"),
    (lambda: mnn.Upsample(size=4, align_corners=False), "align_corners option can only be set"),
    (lambda: mnn.BatchNorm1d(3, affine=False), "BatchNorm1d supports affine=True"),
])
def test_bad_arguments_are_value_errors(make, what):
    with pytest.raises(ValueError, match=re.escape(what)):
        make()


def test_parameters_and_buffers_have_torch_names_and_layouts():
    ln, gn, bn = mnn.LayerNorm((3, 4)), mnn.GroupNorm(2, 6), mnn.BatchNorm1d(5)
    assert {k: v.shape for k, v in ln.state_dict().items()} == {"weight": (3, 4), "bias": (3, 4)}
    assert {k: v.shape for k, v in gn.state_dict().items()} == {"weight": (6,), "bias": (6,)}
    assert list(bn.state_dict()) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    assert list(mnn.LayerNorm(4, bias=False).state_dict()) == ["weight"]
    assert not mnn.LayerNorm(4, elementwise_affine=False).state_dict()
    assert not mnn.GroupNorm(2, 4, affine=False).state_dict()
    assert not mnn.GELU().state_dict() and not mnn.SiLU().state_dict() and not mnn.Upsample(size=3).state_dict()
