"""Tests of the C++ CPU kernels (minidnn._C) against plain NumPy references."""
import zlib

import numpy as np
import pytest

_C = pytest.importorskip("minidnn._C")

DTYPES = [np.float32, np.float64]
TOL = {np.float32: dict(rtol=2e-5, atol=2e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}

# (N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw)
CONV_CASES = [
    (2, 3, 7, 5, 3, 3, 1, 1, 1, 1, 1, 1),      # same padding, odd sizes
    (2, 3, 9, 8, 3, 3, 2, 2, 1, 1, 1, 1),      # stride 2
    (1, 2, 9, 10, 3, 2, 1, 2, 2, 1, 2, 2),     # dilation 2, asymmetric
    (3, 4, 5, 5, 1, 1, 1, 1, 0, 0, 1, 1),      # 1x1
    (2, 2, 6, 7, 1, 1, 2, 2, 0, 0, 1, 1),      # 1x1 stride 2
    (2, 3, 8, 8, 5, 5, 2, 3, 2, 1, 1, 1),      # kernel larger than stride
    (1, 1, 4, 4, 3, 3, 3, 3, 3, 3, 1, 1),      # padding > kernel/2 (whole rows of zeros)
    (2, 5, 11, 13, 3, 3, 3, 4, 0, 2, 2, 1),    # generic strides 3 / 4
    (1, 2, 3, 3, 3, 3, 1, 1, 0, 0, 1, 1),      # output 1x1
    (2, 1, 1, 6, 1, 3, 1, 1, 0, 1, 1, 2),      # H == 1
]

# (kh, kw, sh, sw, ph, pw, dh, dw), padding <= kernel/2 as PyTorch requires
POOL_CASES = [
    (2, 2, 2, 2, 0, 0, 1, 1),
    (3, 3, 2, 2, 1, 1, 1, 1),
    (3, 2, 1, 2, 1, 1, 1, 1),
    (3, 3, 2, 2, 1, 1, 2, 2),
    (1, 1, 2, 2, 0, 0, 1, 1),
    (4, 3, 3, 1, 2, 1, 1, 1),
    (2, 3, 1, 1, 1, 0, 1, 3),
]
POOL_SHAPES = [(2, 3, 7, 9), (1, 2, 8, 8), (2, 1, 5, 6)]


def osz(n, k, s, p, d=1):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))  # stable across runs


# ----------------------------------------------------------------- references
def ref_im2col(x, kh, kw, sh, sw, ph, pw, dh, dw):
    N, C, H, W = x.shape
    OH, OW = osz(H, kh, sh, ph, dh), osz(W, kw, sw, pw, dw)
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    cols = np.empty((C, kh, kw, N, OH, OW), x.dtype)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dh: i * dh + sh * (OH - 1) + 1: sh,
                       j * dw: j * dw + sw * (OW - 1) + 1: sw]
            cols[:, i, j] = patch.transpose(1, 0, 2, 3)
    return cols.reshape(C * kh * kw, N * OH * OW)


def ref_col2im(cols, shape, kh, kw, sh, sw, ph, pw, dh, dw):
    N, C, H, W = shape
    OH, OW = osz(H, kh, sh, ph, dh), osz(W, kw, sw, pw, dw)
    c6 = cols.reshape(C, kh, kw, N, OH, OW)
    xp = np.zeros((N, C, H + 2 * ph, W + 2 * pw), cols.dtype)
    for i in range(kh):
        for j in range(kw):
            xp[:, :, i * dh: i * dh + sh * (OH - 1) + 1: sh,
               j * dw: j * dw + sw * (OW - 1) + 1: sw] += c6[:, i, j].transpose(1, 0, 2, 3)
    return xp[:, :, ph: ph + H, pw: pw + W]


def pool_windows(x, kh, kw, sh, sw, ph, pw, dh, dw, fill):
    """(kh*kw, N, C, OH, OW) stack of window taps in row-major order."""
    N, C, H, W = x.shape
    OH, OW = osz(H, kh, sh, ph, dh), osz(W, kw, sw, pw, dw)
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    taps = [xp[:, :, i * dh: i * dh + sh * (OH - 1) + 1: sh,
               j * dw: j * dw + sw * (OW - 1) + 1: sw]
            for i in range(kh) for j in range(kw)]
    return np.stack(taps)


def ref_maxpool(x, gy, kh, kw, sh, sw, ph, pw, dh, dw):
    N, C, H, W = x.shape
    win = pool_windows(x, kh, kw, sh, sw, ph, pw, dh, dw, -np.inf)
    y = win.max(axis=0)
    arg = win.argmax(axis=0)  # first maximum wins
    OH, OW = y.shape[2:]
    gxp = np.zeros((N, C, H + 2 * ph, W + 2 * pw), x.dtype)
    for k in range(kh * kw):
        i, j = divmod(k, kw)
        gxp[:, :, i * dh: i * dh + sh * (OH - 1) + 1: sh,
            j * dw: j * dw + sw * (OW - 1) + 1: sw] += np.where(arg == k, gy, 0)
    return y.astype(x.dtype), gxp[:, :, ph: ph + H, pw: pw + W]


def ref_avgpool(x, gy, kh, kw, sh, sw, ph, pw, include_pad):
    N, C, H, W = x.shape
    OH, OW = osz(H, kh, sh, ph), osz(W, kw, sw, pw)
    y = np.zeros((N, C, OH, OW), np.float64)
    gx = np.zeros((N, C, H, W), np.float64)
    for oh in range(OH):
        for ow in range(OW):
            h0, w0 = oh * sh - ph, ow * sw - pw
            h1, w1 = min(h0 + kh, H + ph), min(w0 + kw, W + pw)
            pool = (h1 - h0) * (w1 - w0)
            h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, H), min(w1, W)
            div = pool if include_pad else (h1 - h0) * (w1 - w0)
            y[:, :, oh, ow] = x[:, :, h0:h1, w0:w1].astype(np.float64).sum(axis=(2, 3)) / div
            gx[:, :, h0:h1, w0:w1] += gy[:, :, oh: oh + 1, ow: ow + 1] / div
    return y, gx


def ref_bn(x, gamma, beta, gy):
    x = x.astype(np.float64)
    gy = gy.astype(np.float64)
    N, C = x.shape[:2]
    x3 = x.reshape(N, C, -1)
    g3 = gy.reshape(N, C, -1)
    M = x3.shape[0] * x3.shape[2]
    mean = x3.mean(axis=(0, 2))
    var = ((x3 - mean[None, :, None]) ** 2).mean(axis=(0, 2))
    invstd = 1.0 / np.sqrt(var + 1e-5)
    xhat = (x3 - mean[None, :, None]) * invstd[None, :, None]
    y = xhat * gamma[None, :, None] + beta[None, :, None]
    gbeta = g3.sum(axis=(0, 2))
    ggamma = (g3 * xhat).sum(axis=(0, 2))
    gx = (gamma * invstd / M)[None, :, None] * (
        M * g3 - gbeta[None, :, None] - xhat * ggamma[None, :, None])
    return mean, var, invstd, y.reshape(x.shape), gx.reshape(x.shape), ggamma, gbeta


# ---------------------------------------------------------------- im2col etc.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONV_CASES)
def test_im2col_col2im(dtype, case):
    N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw = case
    p = (kh, kw, sh, sw, ph, pw, dh, dw)
    rng = rng_for("conv", case, dtype)
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    OH, OW = osz(H, kh, sh, ph, dh), osz(W, kw, sw, pw, dw)
    cols = np.full((C * kh * kw, N * OH * OW), np.nan, dtype)
    _C.im2col(x, cols, *p)
    np.testing.assert_array_equal(cols, ref_im2col(x, *p))

    c = rng.standard_normal(cols.shape).astype(dtype)
    xo = np.full_like(x, np.nan)  # must be overwritten, not accumulated into
    _C.col2im(c, xo, *p)
    np.testing.assert_allclose(xo, ref_col2im(c, x.shape, *p), **TOL[dtype])

    # determinism: bitwise identical on a second call
    xo2 = np.full_like(x, 7.0)
    _C.col2im(c, xo2, *p)
    assert xo.tobytes() == xo2.tobytes()
    cols2 = np.empty_like(cols)
    _C.im2col(x, cols2, *p)
    assert cols.tobytes() == cols2.tobytes()


@pytest.mark.parametrize("case", CONV_CASES)
def test_im2col_adjoint(case):
    N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw = case
    p = (kh, kw, sh, sw, ph, pw, dh, dw)
    rng = rng_for("adj", case)
    x = rng.standard_normal((N, C, H, W))
    OH, OW = osz(H, kh, sh, ph, dh), osz(W, kw, sw, pw, dw)
    c = rng.standard_normal((C * kh * kw, N * OH * OW))
    cols = np.empty_like(c)
    _C.im2col(x, cols, *p)
    xt = np.empty_like(x)
    _C.col2im(c, xt, *p)
    lhs, rhs = np.vdot(cols, c), np.vdot(x, xt)
    assert abs(lhs - rhs) <= 1e-10 * max(1.0, abs(lhs))


def test_thread_count_independence():
    n0 = _C.get_num_threads()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 16, 20, 20)).astype(np.float32)
    p = (3, 3, 1, 1, 1, 1, 1, 1)
    c = rng.standard_normal((16 * 9, 4 * 400)).astype(np.float32)
    gy = rng.standard_normal(x.shape).astype(np.float32)
    results = []
    try:
        for nt in (1, 2, 3):
            _C.set_num_threads(nt)
            xt = np.empty_like(x)
            _C.col2im(c, xt, *p)
            cols = np.empty_like(c)
            _C.im2col(x, cols, *p)
            mean = np.empty(16, np.float32)
            var = np.empty(16, np.float32)
            _C.bn_stats(x, mean, var)
            invstd = (1 / np.sqrt(var + 1e-5)).astype(np.float32)
            gx = np.empty_like(x)
            gg = np.empty(16, np.float32)
            gb = np.empty(16, np.float32)
            _C.bn_backward(x, gy, np.ones(16, np.float32), mean, invstd, gx, gg, gb)
            mg = np.empty_like(x)
            _C.maxpool2d_backward(x, gy[:, :, :10, :10].copy(), mg, 2, 2, 2, 2, 0, 0, 1, 1)
            wino = []
            for m in (2, 4):      # every Winograd transform, F(2x2,3x3) and F(4x4,3x3)
                t, tiles = (m + 2) ** 2, 4 * (-(-20 // m)) ** 2
                u, v, z = (np.empty((t, 16, k), np.float32) for k in (16, tiles, tiles))
                y, gw = np.empty_like(x), np.empty((16, 16, 3, 3), np.float32)
                _C.winograd_filter_transform(x[0, :, :3, :3].copy().reshape(16, 1, 3, 3).repeat(16, 1), u, True, m)
                _C.winograd_input_transform(x, v, 1, 1, m)
                _C.winograd_output_transform(v, y, gg, m)
                _C.winograd_gradient_transform(gy, z, m)
                _C.winograd_filter_gradient(u, gw, m)
                wino += [u, v, y, z, gw]
            results.append(b"".join(a.tobytes() for a in [xt, cols, mean, var, gx, gg, gb, mg] + wino))
    finally:
        _C.set_num_threads(n0)
    assert results[0] == results[1] == results[2]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 4, 7), (5, 6), (1, 1, 1, 1)])
def test_layout_transposes(dtype, shape):
    rng = rng_for("tr", shape, dtype)
    x = rng.standard_normal(shape).astype(dtype)
    N, C = shape[:2]
    L = int(np.prod(shape[2:], dtype=np.int64))
    ref = x.reshape(N, C, L).transpose(1, 0, 2).reshape(C, N * L)
    out = np.full((C, N * L), np.nan, dtype)
    _C.nchw_to_cn(x, out)
    np.testing.assert_array_equal(out, ref)

    back = np.full(shape, np.nan, dtype)
    _C.cn_to_nchw(out, back)
    np.testing.assert_array_equal(back, x)
    base = rng.standard_normal(shape).astype(dtype)
    acc = base.copy()
    _C.cn_to_nchw(out, acc, accumulate=True)
    np.testing.assert_array_equal(acc, base + x)
    _C.cn_to_nchw(out, acc, True)
    np.testing.assert_array_equal(acc, base + x + x)


# -------------------------------------------------------------------- pooling
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", POOL_SHAPES)
@pytest.mark.parametrize("case", POOL_CASES)
def test_maxpool(dtype, shape, case):
    kh, kw, sh, sw, ph, pw, dh, dw = case
    N, C, H, W = shape
    OH, OW = osz(H, kh, sh, ph, dh), osz(W, kw, sw, pw, dw)
    if OH < 1 or OW < 1:
        pytest.skip("window does not fit")
    rng = rng_for("max", shape, case, dtype)
    # small integers: many ties (first maximum must win) and exact sums
    x = rng.integers(-3, 3, shape).astype(dtype)
    gy = rng.integers(-4, 5, (N, C, OH, OW)).astype(dtype)
    y = np.full((N, C, OH, OW), np.nan, dtype)
    _C.maxpool2d_forward(x, y, *case)
    yr, gxr = ref_maxpool(x, gy, *case)
    np.testing.assert_array_equal(y, yr)
    gx = np.full_like(x, np.nan)
    _C.maxpool2d_backward(x, gy, gx, *case)
    np.testing.assert_array_equal(gx, gxr)
    # continuous values
    x = rng.standard_normal(shape).astype(dtype)
    gy = rng.standard_normal((N, C, OH, OW)).astype(dtype)
    _C.maxpool2d_forward(x, y, *case)
    _C.maxpool2d_backward(x, gy, gx, *case)
    yr, gxr = ref_maxpool(x, gy, *case)
    np.testing.assert_array_equal(y, yr)
    np.testing.assert_allclose(gx, gxr, **TOL[dtype])
    gx2 = np.empty_like(gx)
    _C.maxpool2d_backward(x, gy, gx2, *case)
    assert gx.tobytes() == gx2.tobytes()


def test_maxpool_ties_first_wins_and_neg_inf():
    x = np.full((1, 1, 2, 2), -np.inf)
    y = np.empty((1, 1, 1, 1))
    gx = np.empty_like(x)
    _C.maxpool2d_forward(x, y, 2, 2, 2, 2, 0, 0, 1, 1)
    assert y[0, 0, 0, 0] == -np.inf
    _C.maxpool2d_backward(x, np.ones((1, 1, 1, 1)), gx, 2, 2, 2, 2, 0, 0, 1, 1)
    np.testing.assert_array_equal(gx.ravel(), [1, 0, 0, 0])
    x = np.array([[[[1.0, 5.0], [5.0, 5.0]]]])
    _C.maxpool2d_backward(x, np.ones((1, 1, 1, 1)), gx, 2, 2, 2, 2, 0, 0, 1, 1)
    np.testing.assert_array_equal(gx.ravel(), [0, 1, 0, 0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", POOL_SHAPES)
@pytest.mark.parametrize("case", [c for c in POOL_CASES if c[6:] == (1, 1)])
@pytest.mark.parametrize("include_pad", [True, False])
def test_avgpool(dtype, shape, case, include_pad):
    kh, kw, sh, sw, ph, pw = case[:6]
    N, C, H, W = shape
    OH, OW = osz(H, kh, sh, ph), osz(W, kw, sw, pw)
    rng = rng_for("avg", shape, case, include_pad, dtype)
    x = rng.standard_normal(shape).astype(dtype)
    gy = rng.standard_normal((N, C, OH, OW)).astype(dtype)
    y = np.full((N, C, OH, OW), np.nan, dtype)
    _C.avgpool2d_forward(x, y, kh, kw, sh, sw, ph, pw, include_pad)
    gx = np.full_like(x, np.nan)
    _C.avgpool2d_backward(gy, gx, kh, kw, sh, sw, ph, pw, include_pad)
    yr, gxr = ref_avgpool(x, gy, kh, kw, sh, sw, ph, pw, include_pad)
    np.testing.assert_allclose(y, yr, **TOL[dtype])
    np.testing.assert_allclose(gx, gxr, **TOL[dtype])
    gx2 = np.empty_like(gx)
    _C.avgpool2d_backward(gy, gx2, kh, kw, sh, sw, ph, pw, include_pad)
    assert gx.tobytes() == gx2.tobytes()


# ----------------------------------------------------------------- batch norm
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 3, 5, 7), (3, 5, 9), (8, 6), (2, 4, 17, 3)])
def test_batchnorm(dtype, shape):
    rng = rng_for("bn", shape, dtype)
    C = shape[1]
    x = (rng.standard_normal(shape) * 3 + 2).astype(dtype)
    gy = rng.standard_normal(shape).astype(dtype)
    gamma = rng.standard_normal(C).astype(dtype)
    beta = rng.standard_normal(C).astype(dtype)
    mean_r, var_r, _, _, _, _, _ = ref_bn(x, gamma, beta, gy)

    mean = np.full(C, np.nan, dtype)
    var = np.full(C, np.nan, dtype)
    _C.bn_stats(x, mean, var)
    np.testing.assert_allclose(mean, mean_r, **TOL[dtype])
    np.testing.assert_allclose(var, var_r, **TOL[dtype])

    # use the kernel's statistics so that the rest is checked in isolation
    invstd = (1.0 / np.sqrt(var.astype(np.float64) + 1e-5)).astype(dtype)
    N = shape[0]
    x3 = x.astype(np.float64).reshape(N, C, -1)
    g3 = gy.astype(np.float64).reshape(N, C, -1)
    m64, i64 = mean.astype(np.float64)[None, :, None], invstd.astype(np.float64)[None, :, None]
    xhat = (x3 - m64) * i64
    y_r = (xhat * gamma.astype(np.float64)[None, :, None] + beta[None, :, None]).reshape(shape)
    M = x3.shape[0] * x3.shape[2]
    gb_r = g3.sum(axis=(0, 2))
    gg_r = (g3 * xhat).sum(axis=(0, 2))
    gx_r = (gamma.astype(np.float64)[None, :, None] * i64 / M) * (
        M * g3 - gb_r[None, :, None] - xhat * gg_r[None, :, None])
    gx_r = gx_r.reshape(shape)

    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else TOL[dtype]
    y = np.full_like(x, np.nan)
    _C.bn_forward_train(x, gamma, beta, mean, invstd, y)
    np.testing.assert_allclose(y, y_r, **tol)
    y_inplace = x.copy()
    _C.bn_forward_train(y_inplace, gamma, beta, mean, invstd, y_inplace)
    assert y_inplace.tobytes() == y.tobytes()

    gx = np.full_like(x, np.nan)
    gg = np.full(C, np.nan, dtype)
    gb = np.full(C, np.nan, dtype)
    _C.bn_backward(x, gy, gamma, mean, invstd, gx, gg, gb)
    np.testing.assert_allclose(gg, gg_r, **tol)
    np.testing.assert_allclose(gb, gb_r, **tol)
    np.testing.assert_allclose(gx, gx_r, **tol)
    gx2 = np.empty_like(gx)
    _C.bn_backward(x, gy, gamma, mean, invstd, gx2, None, None)
    assert gx.tobytes() == gx2.tobytes()
    gg2 = np.empty_like(gg)
    _C.bn_backward(x, gy, gamma, mean, invstd, gx2, ggamma=gg2)
    assert gg.tobytes() == gg2.tobytes()


def test_batchnorm_gradient_numerically():
    """bn_backward is the true gradient of sum(gy * bn(x)) w.r.t. x, gamma, beta."""
    rng = np.random.default_rng(3)
    shape, C = (3, 2, 2, 2), 2
    x = rng.standard_normal(shape)
    gy = rng.standard_normal(shape)
    gamma, beta = rng.standard_normal(C), rng.standard_normal(C)
    eps = 1e-5

    def loss(x, gamma, beta):
        mean, var = np.empty(C), np.empty(C)
        _C.bn_stats(x, mean, var)
        y = np.empty_like(x)
        _C.bn_forward_train(x, gamma, beta, mean, 1 / np.sqrt(var + eps), y)
        return float(np.vdot(gy, y))

    mean, var = np.empty(C), np.empty(C)
    _C.bn_stats(x, mean, var)
    gx, gg, gb = np.empty_like(x), np.empty(C), np.empty(C)
    _C.bn_backward(x, gy, gamma, mean, 1 / np.sqrt(var + eps), gx, gg, gb)
    h = 1e-6
    for arr, grad, which in ((x, gx, 0), (gamma, gg, 1), (beta, gb, 2)):
        num = np.empty_like(arr)
        for idx in np.ndindex(arr.shape):
            args = [x.copy(), gamma.copy(), beta.copy()]
            args[which][idx] += h
            lp = loss(*args)
            args[which][idx] -= 2 * h
            num[idx] = (lp - loss(*args)) / (2 * h)
        np.testing.assert_allclose(grad, num, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- elementwise
@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_backward_and_add_inplace(dtype):
    rng = np.random.default_rng(5)
    y = np.maximum(rng.standard_normal((3, 4, 5)), 0).astype(dtype)
    y[0, 0, :2] = 0
    gy = rng.standard_normal((3, 4, 5)).astype(dtype)
    gx = np.full((60,), np.nan, dtype)  # any shape with the same size
    _C.relu_backward(y, gy, gx)
    np.testing.assert_array_equal(gx, np.where(y > 0, gy, 0).ravel())
    g2 = gy.copy()
    _C.relu_backward(y, g2, g2)  # in place
    np.testing.assert_array_equal(g2.ravel(), gx)

    big = rng.standard_normal(300_001).astype(dtype)  # exercises the parallel path
    d = rng.standard_normal(300_001).astype(dtype)
    ref = d + big
    _C.add_inplace(d, big)
    np.testing.assert_array_equal(d, ref)
    d2 = gy.copy()
    _C.add_inplace(d2, gy.reshape(60))
    np.testing.assert_array_equal(d2, 2 * gy)


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_forward_add_and_copy(dtype):
    rng = np.random.default_rng(6)
    x = rng.standard_normal(300_001).astype(dtype)     # the parallel path
    x[:4] = [np.nan, -np.inf, np.inf, -0.0]
    y = np.full_like(x, 7)
    _C.relu_forward(x, y)
    np.testing.assert_array_equal(y, np.maximum(x, 0))  # NaN stays NaN, as numpy's and PyTorch's
    x2 = x.copy()
    _C.relu_forward(x2, x2)                             # in place
    np.testing.assert_array_equal(x2, y)
    b = rng.standard_normal(300_001).astype(dtype)
    out = np.empty_like(x)
    _C.add(x, b, out)
    np.testing.assert_array_equal(out, x + b)
    _C.add(b, None, out)                                # a copy
    assert out.tobytes() == b.tobytes()
    _C.add(out, out, out)                               # in place
    np.testing.assert_array_equal(out, 2 * b)
    with pytest.raises(ValueError, match="'b'"):
        _C.add(x, b[1:], out)
    with pytest.raises(ValueError, match="'y'"):
        _C.relu_forward(x, y[1:])


# --------------------------------------------------------------------- errors
def test_errors():
    x = np.zeros((2, 3, 6, 6), np.float32)
    cols = np.zeros((27, 72), np.float32)
    p = (3, 3, 1, 1, 1, 1, 1, 1)
    _C.im2col(x, cols, *p)  # valid
    with pytest.raises(ValueError, match="cols"):
        _C.im2col(x, np.zeros((27, 71), np.float32), *p)
    with pytest.raises(ValueError, match="'x'"):
        _C.im2col(np.zeros((2, 3, 12, 6), np.float32)[:, :, ::2], cols, *p)  # non-contiguous
    with pytest.raises(ValueError, match="cols"):
        _C.im2col(x, np.asfortranarray(cols), *p)
    with pytest.raises(TypeError, match="cols"):
        _C.im2col(x, cols.astype(np.float64), *p)  # mixed dtypes
    with pytest.raises(TypeError, match="'x'"):
        _C.im2col(x.astype(np.int32), cols, *p)
    with pytest.raises(TypeError, match="'x'"):
        _C.im2col(x.tolist(), cols, *p)
    with pytest.raises(TypeError, match="'x'"):
        _C.im2col(x.astype(">f4"), cols, *p)  # non-native byte order
    with pytest.raises(ValueError, match="'x'"):
        _C.im2col(np.zeros((3, 6, 6), np.float32), cols, *p)
    with pytest.raises(ValueError):
        _C.im2col(x, cols, 9, 9, 1, 1, 0, 0, 1, 1)  # window does not fit
    with pytest.raises(ValueError):
        _C.im2col(x, cols, 3, 3, 0, 1, 1, 1, 1, 1)  # stride 0
    ro = cols.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="cols"):
        _C.im2col(x, ro, *p)
    with pytest.raises(ValueError, match="cols"):
        _C.col2im(np.zeros((27, 70), np.float32), x, *p)
    with pytest.raises(ValueError, match="'x'"):
        _C.col2im(cols, np.zeros((2, 3, 6, 6), np.float32)[:, ::-1], *p)
    buf = np.zeros(100, np.float32)
    with pytest.raises(ValueError, match="overlap"):
        _C.nchw_to_cn(buf[:24].reshape(2, 3, 4), buf[10:34].reshape(3, 8))

    with pytest.raises(ValueError, match="out"):
        _C.nchw_to_cn(x, np.zeros((3, 71), np.float32))
    with pytest.raises(ValueError, match="src"):
        _C.cn_to_nchw(np.zeros((3, 71), np.float32), x)

    y = np.zeros((2, 3, 3, 3), np.float32)
    _C.maxpool2d_forward(x, y, 2, 2, 2, 2, 0, 0, 1, 1)
    with pytest.raises(ValueError, match="'y'"):
        _C.maxpool2d_forward(x, np.zeros((2, 3, 3, 4), np.float32), 2, 2, 2, 2, 0, 0, 1, 1)
    with pytest.raises(ValueError, match="padding"):
        _C.maxpool2d_forward(x, y, 2, 2, 2, 2, 2, 2, 1, 1)
    with pytest.raises(ValueError, match="gx"):
        _C.maxpool2d_backward(x, y, np.zeros((2, 3, 6, 5), np.float32), 2, 2, 2, 2, 0, 0, 1, 1)
    with pytest.raises(TypeError, match="gy"):
        _C.maxpool2d_backward(x, y.astype(np.float64), x.copy(), 2, 2, 2, 2, 0, 0, 1, 1)
    with pytest.raises(ValueError, match="gy"):
        _C.avgpool2d_backward(np.zeros((2, 3, 3, 2), np.float32), x, 2, 2, 2, 2, 0, 0, True)
    with pytest.raises(ValueError, match="'y'"):
        _C.avgpool2d_forward(x, y[:, :, :, ::2], 2, 2, 2, 2, 0, 0, False)

    p, g = np.zeros(10, np.float32), np.zeros(10, np.float32)
    _C.sgd_update(p, g, None, 0.1, 0.0, 0.0, 0.0, False, False)
    with pytest.raises(ValueError, match="buf"):
        _C.sgd_update(p, g, None, 0.1, 0.9, 0.0, 0.0, False, False)   # momentum without a buffer
    with pytest.raises(ValueError, match="'g'"):
        _C.sgd_update(p, np.zeros(9, np.float32), None, 0.1, 0.0, 0.0, 0.0, False, False)
    with pytest.raises(TypeError, match="buf"):
        _C.sgd_update(p, g, np.zeros(10), 0.1, 0.9, 0.0, 0.0, False, False)   # float64 buffer

    v = np.zeros((36, 3, 2 * 2 * 2), np.float32)      # F(4x4,3x3) tiles of x padded by 1: 2x2 per sample
    _C.winograd_input_transform(x, v, 1, 1, 4)
    with pytest.raises(ValueError, match="'V'"):
        _C.winograd_input_transform(x, v, 1, 1, 2)     # F(2x2,3x3) wants (16, 3, 2*3*3)
    with pytest.raises(ValueError, match="tile must be 2 or 4"):
        _C.winograd_input_transform(x, v, 1, 1, 3)
    with pytest.raises(ValueError, match="'U'"):
        _C.winograd_filter_transform(np.zeros((4, 3, 3, 3), np.float32), np.zeros((36, 3, 4), np.float32), False, 4)
    with pytest.raises(ValueError, match="'D'"):
        _C.winograd_filter_gradient(np.zeros((16, 4, 3), np.float32), np.zeros((4, 3, 3, 3), np.float32), 4)
    with pytest.raises(ValueError, match="'Z'"):
        _C.winograd_gradient_transform(x, np.zeros((36, 3, 7), np.float32), 4)

    m, v = np.zeros(3, np.float32), np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="var"):
        _C.bn_stats(x, m, np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="mean"):
        _C.bn_stats(x, m.astype(np.float64), v)
    with pytest.raises(ValueError, match="gx"):
        _C.bn_backward(x, x, m, m, v, np.zeros((2, 3, 6, 5), np.float32), None, None)
    with pytest.raises(ValueError, match="ggamma"):
        _C.bn_backward(x, x, m, m, v, x.copy(), np.zeros(2, np.float32), None)
    with pytest.raises(ValueError, match="'y'"):
        _C.bn_forward_train(x, m, m, m, v, np.zeros((2, 3, 36), np.float32))
    with pytest.raises(ValueError, match="beta"):
        _C.bn_forward_train(x, m, np.zeros(2, np.float32), m, v, x.copy())

    with pytest.raises(ValueError, match="gx"):
        _C.relu_backward(x, x, np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="src"):
        _C.add_inplace(x, np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="src"):
        _C.add_inplace(x, np.zeros((2, 3, 6, 12), np.float32)[..., ::2])
    with pytest.raises(ValueError, match="overlap"):
        _C.add_inplace(buf[:50], buf[10:60])
