"""Ops make their arrays with the backend's array module (``ctx.xp``), never with NumPy's directly.

A CuPy array refuses to meet a NumPy array (an operand, an index, an ``out=``); a NumPy
``arange`` index or ``zeros`` accumulator beside device arrays fails only on a GPU. ``Device``
arrays below refuse the same, on the CPU: exact-BatchNorm sub-batching's three ops (every split
step with ``bn="exact"``, the default) and BatchNorm's running statistics run on them and give
NumPy's bits.
"""
import types

import numpy as np
import pytest

from minidnn.backend import get_backend
from minidnn.executor import Context
from minidnn.ops.norm import BatchNorm2dOp
from minidnn.ops.norm_split import BatchNormApplyOp, BatchNormCombineOp, BatchNormStatsOp, _block
from minidnn.ops.base import nbytes_of


def _refuse(values):
    for v in values:
        if type(v) is np.ndarray:
            raise TypeError("a NumPy array meets a device array (CuPy raises here)")
        if isinstance(v, tuple):
            _refuse(v)


def _plain(v):
    if isinstance(v, Device):
        return v.view(np.ndarray)
    if isinstance(v, tuple):
        return tuple(map(_plain, v))
    return v


def _device(v):
    return v.view(Device) if type(v) is np.ndarray else v


class Device(np.ndarray):
    """Stands in for a CuPy array: NumPy's arrays may not take part in its arithmetic, indexing or
    functions (CuPy raises TypeError for each); results are Device arrays. ``bool()`` of one raises
too: on a GPU it is a host sync, which a step's hot path must not make."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kw):
        _refuse(inputs)
        _refuse(kw.get("out", ()))
        _refuse((kw.get("where"),))
        out = kw.get("out")
        kw = {k: _plain(v) for k, v in kw.items()}
        r = getattr(ufunc, method)(*map(_plain, inputs), **kw)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return tuple(map(_device, r)) if isinstance(r, tuple) else _device(r)

    def __array_function__(self, func, types_, args, kwargs):
        if any(t is np.ndarray for t in types_):
            raise TypeError(f"{func.__name__}: a NumPy array meets a device array (CuPy raises here)")
        r = func(*_plain(tuple(args)), **{k: _plain(v) for k, v in kwargs.items()})
        return _device(r)

    def __getitem__(self, index):
        _refuse(index if isinstance(index, tuple) else (index,))
        return _device(np.ndarray.__getitem__(self.view(np.ndarray), _plain(index)))

    def __bool__(self):
        raise TypeError("bool() of a device array: the host waits for the GPU here")

    def __setitem__(self, index, value):
        _refuse(index if isinstance(index, tuple) else (index,))
        _refuse((value,))
        np.ndarray.__setitem__(self.view(np.ndarray), _plain(index), _plain(value))


class _DeviceModule:
    """The array module of ``Device`` arrays: NumPy's functions, whose new arrays are Device arrays."""

    def __getattr__(self, name):
        f = getattr(np, name)
        if not callable(f) or isinstance(f, type):
            return f

        def wrapped(*a, **kw):
            return _device(f(*a, **kw))
        return wrapped


def dev(a):
    return np.array(a).view(Device)


def test_the_stand_in_refuses_what_cupy_refuses():
    a = dev(np.zeros(3))
    with pytest.raises(TypeError):
        a + np.ones(3)
    with pytest.raises(TypeError):
        a[np.arange(2)]
    with pytest.raises(TypeError):
        np.bincount(np.arange(3), weights=a)
    assert type(a + dev(np.ones(3))) is Device and type(_DeviceModule().arange(3)) is Device


def _ctx(xp):
    ctx = Context.on(get_backend("cpu"), np.random.default_rng(0))
    return ctx if xp is np else Context(ctx.k, ctx.rng, xp=xp, conv=ctx.conv)


def _exact_bn(xp, wrap):
    """Stats of two sub-batches, their combination, apply's backward, combine's, stats' (float64)."""
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((3, 5, 4, 4)) for _ in range(2)]      # 15 rows: blocks cross channels
    gamma, beta = rng.standard_normal(5), rng.standard_normal(5)
    rmean, rvar = np.zeros(5), np.ones(5)
    ctx = _ctx(xp)
    stats_op, comb, app = BatchNormStatsOp(), BatchNormCombineOp(2), BatchNormApplyOp()
    ins_spec = types.SimpleNamespace(shape=xs[0].shape)
    ws = np.zeros(nbytes_of(_block(ins_spec, 2)), np.uint8)
    xs, gamma, beta, rmean, rvar, ws = map(wrap, (xs[0], xs[1])), wrap(gamma), wrap(beta), wrap(rmean), \
        wrap(rvar), wrap(ws)
    xs = list(xs)
    stats = [wrap(np.zeros((3, 5))) for _ in xs]
    for x, st in zip(xs, stats):
        stats_op.forward(ctx, [x], [st], ws)
    mean, invstd = wrap(np.zeros(5)), wrap(np.zeros(5))
    comb.forward(ctx, stats + [gamma, beta, rmean, rvar], [mean, invstd], ws)
    gys = [wrap(rng.standard_normal(x.shape)) for x in xs]
    sums = [wrap(np.zeros(5)), wrap(np.zeros(5))]
    gxs = [wrap(np.zeros(x.shape)) for x in xs]
    for x, gy, gx in zip(xs, gys, gxs):
        part = [wrap(np.zeros(5)), wrap(np.zeros(5))]
        app.backward(ctx, [x, gamma, beta, mean, invstd], [None], [gy], [gx, None, None, part[0], part[1]], ws)
        for s, p in zip(sums, part):
            s += p
    gstats = [wrap(np.zeros((3, 5))) for _ in xs]
    ggamma, gbeta = wrap(np.zeros(5)), wrap(np.zeros(5))
    comb.backward(ctx, stats + [gamma, beta, rmean, rvar], [mean, invstd], sums,
                  gstats + [ggamma, gbeta, None, None], ws)
    ctx.accumulate = (0,)
    for x, st, g, gx in zip(xs, stats, gstats, gxs):
        stats_op.backward(ctx, [x], [st], [g], [gx], ws)
    return [np.asarray(a.view(np.ndarray)) for a in stats + [mean, invstd, rmean, rvar, ggamma, gbeta] + gxs]


def test_exact_batch_norm_ops_use_the_backends_array_module():
    want = _exact_bn(np, np.asarray)
    got = _exact_bn(_DeviceModule(), dev)
    for w, g in zip(want, got):
        assert np.array_equal(w, g)


@pytest.mark.parametrize("bad", [False, True])
def test_batch_norm_running_statistics_stay_on_the_device(bad):
    """The running statistics' update makes no NumPy temporaries and no host sync (``bool`` of a device
    array), and a non-finite batch leaves them as they were."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3, 5, 5))
    if bad:
        x[0, 1, 2, 2] = np.inf
    op = BatchNorm2dOp()

    def run(xp, wrap):
        ins = [wrap(x), wrap(np.ones(3)), wrap(np.zeros(3)), wrap(np.full(3, 0.5)), wrap(np.full(3, 2.0))]
        outs = [wrap(np.zeros(x.shape)), wrap(np.zeros(3)), wrap(np.zeros(3))]
        op.forward(_ctx(xp), ins, outs, None)
        return [np.asarray(a.view(np.ndarray)) for a in ins[3:]]

    want, got = run(np, np.asarray), run(_DeviceModule(), dev)
    for w, g in zip(want, got):
        assert np.array_equal(w, g)
    if bad:
        assert np.array_equal(got[0], np.full(3, 0.5)) and np.array_equal(got[1], np.full(3, 2.0))
    else:
        assert not np.array_equal(got[0], np.full(3, 0.5))
