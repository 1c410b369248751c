"""Convolution algorithms of the CPU backend: every algorithm of every pass against the
default (whole-batch im2col) on awkward shapes, their workspace contract, determinism,
and the on-disk profiling cache."""
import multiprocessing as mp
import tracemalloc
import types
import warnings
import zlib

import numpy as np
import pytest

_C = pytest.importorskip("minidnn._C")

from minidnn.algo_cache import AlgoCache, profile_conv  # noqa: E402
from minidnn.graph import Spec  # noqa: E402
from minidnn.ops import conv_algos  # noqa: E402
from minidnn.ops.conv import Conv2dOp, ConvTranspose2dOp  # noqa: E402
from minidnn.backend.lanes import Lanes  # noqa: E402

CONV = conv_algos.Convolutions(Lanes(_C))   # runs the lane variants, as the CPU backend does

# name: (N, C, H, W, O, kh, kw, stride, padding, dilation, groups, bias)
CASES = {
    "s2_p1": (3, 4, 9, 8, 6, 3, 3, 2, 1, 1, 1, True),
    "dil2": (2, 3, 9, 10, 4, 3, 3, 1, 2, 2, 1, True),
    "groups2": (3, 4, 7, 7, 6, 3, 3, 1, 1, 1, 2, False),
    "depthwise": (2, 6, 8, 9, 6, 3, 3, 1, 1, 1, 6, True),
    "odd_5x3_pad": (5, 3, 11, 13, 5, 5, 3, (2, 1), (2, 1), 1, 1, True),
    "pad_gt_half": (2, 2, 4, 4, 3, 3, 3, 3, 3, 1, 1, True),
    "1x1": (3, 8, 5, 7, 6, 1, 1, 1, 0, 1, 1, True),
    "1x1_g2": (2, 8, 4, 5, 6, 1, 1, 1, 0, 1, 2, False),
    "1x1_s2": (3, 4, 7, 7, 8, 1, 1, 2, 0, 1, 1, False),
    "3x3_odd_out": (3, 5, 9, 11, 7, 3, 3, 1, 1, 1, 1, True),
    "3x3_p0": (2, 4, 8, 9, 3, 3, 3, 1, 0, 1, 1, True),
    "3x3_p2": (2, 3, 6, 7, 4, 3, 3, 1, 2, 1, 1, False),
    "wide_row": (2, 3, 6, 41, 5, 3, 3, 1, 1, 1, 1, True),
    "wide_s2": (5, 3, 6, 43, 4, 3, 3, 2, 1, 1, 1, True),
    "wide_dil2_g2": (2, 4, 7, 45, 6, 3, 3, 1, 2, 2, 2, True),
    "stem_7x7": (2, 3, 19, 21, 8, 7, 7, 2, 3, 1, 1, False),
    "batch1": (1, 3, 5, 6, 2, 2, 2, 1, 0, 1, 1, True),
}
DTYPES = [np.float32, np.float64]


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def make(case, dtype):
    n, c, h, w, o, kh, kw, s, p, d, g, bias = CASES[case]
    op = Conv2dOp(s, p, d, g)
    r = rng_for(case, np.dtype(dtype).name)
    ins = [r.standard_normal((n, c, h, w)), r.standard_normal((o, c // g, kh, kw))]
    if bias:
        ins.append(r.standard_normal(o))
    ins = [a.astype(dtype) for a in ins]
    in_specs = [Spec(a.shape, a.dtype) for a in ins]
    (y,) = op.infer(*in_specs)
    gy = r.standard_normal(y.shape).astype(dtype)
    return op, ins, in_specs, [y], gy


def ctx(name):
    return types.SimpleNamespace(k=_C, rng=None, recompute=False, algo=name, conv=CONV)


def run(op, ins, out_specs, gy, pass_, algo, ws=None):
    """Run one pass in fresh buffers; returns the outputs (forward) or (gx, gw[, gb])."""
    if ws is None:
        ws = np.empty(algo.workspace, np.uint8)
    if pass_ == "forward":
        outs = [np.full(s.shape, np.nan, s.dtype) for s in out_specs]
        op.forward(ctx(algo.name), ins, outs, ws)
        return outs
    gins = [np.full(a.shape, np.nan, a.dtype) for a in ins]
    op.backward(ctx(algo.name), ins, [None], [gy], gins, ws)
    return gins


def tol(dtype, ref):
    scale = max(float(np.abs(ref).max()), 1.0)
    return dict(rtol=1e-10, atol=1e-10 * scale) if dtype == np.float64 else dict(rtol=1e-4, atol=1e-5 * scale)


# -------------------------------------------------------------- equivalence
@pytest.mark.parametrize("pass_", ["forward", "backward"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_algorithm_matches_default(case, dtype, pass_):
    op, ins, in_specs, out_specs, gy = make(case, dtype)
    algos = CONV.algorithms(op, in_specs, out_specs, pass_)
    assert algos[0].name == "im2col"
    ref = run(op, ins, out_specs, gy, pass_, algos[0])
    for a in algos[1:]:
        got = run(op, ins, out_specs, gy, pass_, a)
        for i, (x, r) in enumerate(zip(got, ref)):
            np.testing.assert_allclose(x, r, **tol(dtype, r), err_msg=f"{a.name}: output {i}")


def test_default_matches_torch():
    torch = pytest.importorskip("torch")
    for case in ("s2_p1", "dil2", "groups2", "odd_5x3_pad"):
        op, ins, in_specs, out_specs, gy = make(case, np.float64)
        a = op.algorithms(in_specs, out_specs, "forward")[0]
        (y,) = run(op, ins, out_specs, gy, "forward", a)
        t = [torch.tensor(v) for v in ins]
        ref = torch.nn.functional.conv2d(*t, stride=op.stride, padding=op.padding, dilation=op.dilation,
                                         groups=op.groups)
        np.testing.assert_allclose(y, ref.numpy(), rtol=1e-10, atol=1e-10)


def test_listed_algorithms():
    op, ins, in_specs, out_specs, gy = make("3x3_odd_out", np.float32)   # N = 3
    g = conv_algos.Geom.of(op, *in_specs[:2], out_specs[0])
    assert conv_algos.names(g, "forward") == ["im2col", "im2col_chunk2", "im2col_chunk1", "direct", "winograd"]
    # on 2 lanes: one chunk of 2 per lane, and one sample per lane
    assert conv_algos.names(g, "forward", lanes=2) == ["im2col", "im2col_chunk2", "im2col_chunk1",
                                                       "im2col_chunk2x2", "im2col_chunk1x2", "direct", "winograd"]
    # the op's own list (what plans for a device profile choose from) has no lanes; the CPU backend's has
    assert [a.name for a in op.algorithms(in_specs, out_specs, "forward")] == conv_algos.names(g, "forward")
    assert [a.name for a in CONV.algorithms(op, in_specs, out_specs, "forward")] == \
        conv_algos.names(g, "forward", conv_algos.default_lanes(), CONV.implicit, cpu=True)
    bwd = {a.name: a.workspace for a in op.algorithms(in_specs, out_specs, "backward")}
    assert {"im2col", "im2col_chunk2", "im2col_chunk1", "direct", "winograd/im2col", "winograd/direct",
            "direct/im2col_chunk1", "im2col/direct"} <= set(bwd)
    assert bwd["direct"] == 0 and bwd["winograd/direct"] > 0
    cpu = {a.name: a.workspace for a in CONV.algorithms(op, in_specs, out_specs, "backward")}
    assert {"winograd", "winograd4x4", "im2col/winograd4x4", "winograd4x4/winograd"} <= set(cpu)
    # F(4x4,3x3) transforms 36 points per 16 outputs, F(2x2,3x3) 16 per 4: less workspace
    assert 0 < cpu["winograd4x4"] < cpu["winograd"]
    assert bwd["im2col_chunk1"] < bwd["im2col_chunk2"] < bwd["im2col"]
    # the default's workspace is what workspace()/backward_workspace() report
    assert op.workspace(in_specs, out_specs) == op.algorithms(in_specs, out_specs, "forward")[0].workspace
    assert op.backward_workspace(in_specs, out_specs) == bwd["im2col"]
    op1, _, s1, o1, _ = make("1x1", np.float32)
    assert "gemm1x1" in [a.name for a in op1.algorithms(s1, o1, "forward")]
    assert "winograd" not in [a.name for a in op1.algorithms(s1, o1, "forward")]
    for case in ("s2_p1", "dil2", "depthwise"):
        o, _, s, out, _ = make(case, np.float32)
        assert not {"winograd", "winograd4x4", "gemm1x1"} & {a.name for a in o.algorithms(s, out, "forward")}
    op_b, _, s_b, o_b, _ = make("batch1", np.float32)
    assert not [a for a in op_b.algorithms(s_b, o_b, "forward") if "chunk" in a.name]


def test_unknown_or_inapplicable_algorithm_raises():
    op, ins, in_specs, out_specs, gy = make("s2_p1", np.float32)
    y = np.empty(out_specs[0].shape, np.float32)
    for name in ("fft", "im2col_chunk0", "winograd", "gemm1x1"):
        with pytest.raises(ValueError):
            op.forward(ctx(name), ins, [y], np.empty(1 << 20, np.uint8))
    with pytest.raises(ValueError):
        op.backward(ctx("direct/winograd"), ins, [None], [gy], [None, np.empty_like(ins[1]), None], None)
    with pytest.raises(ValueError):
        op.algorithms(in_specs, out_specs, "sideways")


def test_none_means_default():
    op, ins, in_specs, out_specs, gy = make("odd_5x3_pad", np.float64)
    a = op.algorithms(in_specs, out_specs, "forward")[0]
    ws = np.empty(a.workspace, np.uint8)
    y1, y2 = (np.empty(out_specs[0].shape) for _ in range(2))
    op.forward(ctx(None), ins, [y1], ws)
    op.forward(types.SimpleNamespace(k=_C, rng=None, recompute=False), ins, [y2], ws)  # no attribute
    np.testing.assert_array_equal(y1, run(op, ins, out_specs, gy, "forward", a)[0])
    np.testing.assert_array_equal(y1, y2)


# ------------------------------------------------------- workspace contract
@pytest.mark.parametrize("case", ["s2_p1", "depthwise", "1x1", "3x3_odd_out", "wide_s2", "odd_5x3_pad"])
def test_writes_only_outputs_and_workspace(case):
    """Inputs untouched; nothing written around the outputs or past the workspace."""
    op, ins, in_specs, out_specs, gy = make(case, np.float32)
    guard = 64
    for pass_ in ("forward", "backward"):
        for a in CONV.algorithms(op, in_specs, out_specs, pass_):
            before = [x.copy() for x in ins] + [gy.copy()]
            wsbuf = np.full(a.workspace + guard, 0xAB, np.uint8)
            shapes = [s.shape for s in out_specs] if pass_ == "forward" else [x.shape for x in ins]
            bufs = [np.full(int(np.prod(s)) + 2 * guard, -7.0, np.float32) for s in shapes]
            views = [b[guard:-guard].reshape(s) for b, s in zip(bufs, shapes)]
            if pass_ == "forward":
                op.forward(ctx(a.name), ins, views, wsbuf[:a.workspace])
            else:
                op.backward(ctx(a.name), ins, [None], [gy], views, wsbuf[:a.workspace])
            for x, b in zip(ins + [gy], before):
                np.testing.assert_array_equal(x, b, err_msg=f"{a.name} changed an input")
            for b in bufs:
                assert (b[:guard] == -7.0).all() and (b[-guard:] == -7.0).all(), f"{pass_} {a.name}"
                assert np.isfinite(b).all(), f"{pass_} {a.name} left an output unwritten"
            assert (wsbuf[a.workspace:] == 0xAB).all(), f"{pass_} {a.name} wrote past its workspace"


@pytest.mark.parametrize("case", ["s2_p1", "groups2", "1x1", "1x1_g2", "wide_row", "stem_7x7"])
def test_zero_workspace_algorithms_allocate_nothing(case):
    """Algorithms listed with 0 bytes run with an empty (or no) workspace and make no
    NumPy allocation beyond a few per-channel bytes."""
    op, ins, in_specs, out_specs, gy = make(case, np.float32)
    for pass_ in ("forward", "backward"):
        zero = [a for a in op.algorithms(in_specs, out_specs, pass_) if a.workspace == 0]
        assert "direct" in [a.name for a in zero]
        for a in zero:
            ref = run(op, ins, out_specs, gy, pass_, a)
            for ws in (np.empty(0, np.uint8), None):
                outs = [np.empty_like(r) for r in ref]
                tracemalloc.start()
                if pass_ == "forward":
                    op.forward(ctx(a.name), ins, outs, ws)
                else:
                    op.backward(ctx(a.name), ins, [None], [gy], outs, ws)
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                assert peak < 4096, f"{pass_} {a.name} allocated {peak} bytes"
                for o, r in zip(outs, ref):
                    np.testing.assert_array_equal(o, r)


def test_1x1_forward_and_data_allocate_nothing():
    op, ins, in_specs, out_specs, gy = make("1x1", np.float32)
    a = [a for a in op.algorithms(in_specs, out_specs, "forward") if a.name == "gemm1x1"][0]
    assert a.workspace == 0
    b = [a for a in op.algorithms(in_specs, out_specs, "backward") if a.name == "gemm1x1"][0]
    # the filter gradient sums per-sample GEMMs through one filter-sized partial
    assert 0 < b.workspace <= 64 * (ins[1].size * 4 // 64 + 1)


@pytest.mark.parametrize("case", list(CASES))
def test_implicit_is_listed_where_it_applies(case):
    """float32, on the CPU backend where the CPU has AVX-512F; the backward-data half only at stride 1
    where gy's padding d*(k-1) - p is not negative; never in what device-profile plans choose from."""
    for dtype in DTYPES:
        op, ins, in_specs, out_specs, gy = make(case, dtype)
        g = conv_algos.Geom.of(op, *in_specs[:2], out_specs[0])
        fwd = [a.name for a in CONV.algorithms(op, in_specs, out_specs, "forward")]
        bwd = [a.name for a in CONV.algorithms(op, in_specs, out_specs, "backward")]
        applies = CONV.implicit and dtype == np.float32
        assert ("implicit" in fwd) == applies
        assert any(n.endswith("/implicit") for n in bwd) == applies
        assert ("implicit" in bwd) == (applies and g.stride == (1, 1) and all(
            p <= d * (k - 1) for p, d, k in zip(g.padding, g.dilation, (g.kh, g.kw))))
        assert not [a for a in op.algorithms(in_specs, out_specs, "forward") if a.name == "implicit"]


def test_a_backend_without_implicit_lists_none(monkeypatch):
    from minidnn.backend.cpu import CPUBackend
    from minidnn.errors import BackendUnavailable
    op, ins, in_specs, out_specs, gy = make("3x3_odd_out", np.float32)
    be = CPUBackend(implicit=False)
    for pass_ in ("forward", "backward"):
        assert not [a for a in be.conv.algorithms(op, in_specs, out_specs, pass_) if "implicit" in a.name]
    monkeypatch.setattr(conv_algos, "implicit_available", lambda: False)
    with pytest.raises(BackendUnavailable, match="AVX-512F"):
        CPUBackend(implicit=True)
    assert not CPUBackend().conv.implicit


def test_winograd_sets():
    """The CPU backend lists F(2x2,3x3) and F(4x4,3x3) for every pass of a 3x3 stride-1 layer (the
    data pass where gy's padding 2 - p is not negative); device-profile plans choose from F(2x2,3x3)
    for the forward and data passes, with their own speed hint; CPUBackend(winograd=False) lists none."""
    from minidnn.backend.cpu import CPUBackend
    for case in ("3x3_odd_out", "3x3_p2", "pad_gt_half", "s2_p1"):
        op, ins, in_specs, out_specs, gy = make(case, np.float32)
        g = conv_algos.Geom.of(op, *in_specs[:2], out_specs[0])
        halves = {p for a in CONV.algorithms(op, in_specs, out_specs, "backward")
                  for p in zip(("data", "filter"), conv_algos.split(a.name, "backward"))}
        for m in ("winograd", "winograd4x4"):
            assert (m in [a.name for a in CONV.algorithms(op, in_specs, out_specs, "forward")]) == g.is_winograd
            assert (("data", m) in halves) == g.winograd_data
            assert (("filter", m) in halves) == g.is_winograd
        device = {a.name: a for a in op.algorithms(in_specs, out_specs, "backward")}
        assert not [n for n in device if "winograd4x4" in n or n.endswith("/winograd") or n == "winograd"]
        assert ("winograd/im2col" in device) == g.winograd_data
        for pass_ in ("forward", "backward"):
            assert not [a for a in CPUBackend(winograd=False).conv.algorithms(op, in_specs, out_specs, pass_)
                        if "winograd" in a.name]
    op, ins, in_specs, out_specs, gy = make("3x3_odd_out", np.float32)
    cpu = {a.name: a.speed for a in CONV.algorithms(op, in_specs, out_specs, "forward")}
    device = {a.name: a.speed for a in op.algorithms(in_specs, out_specs, "forward")}
    assert cpu["winograd"] != device["winograd"]       # the CPU kernels' model vs the profiles' hint


@pytest.mark.skipif(not CONV.implicit, reason="this CPU has no AVX-512F")
def test_implicit_rejects_what_it_does_not_run():
    op, ins, in_specs, out_specs, gy = make("s2_p1", np.float32)      # backward-data: stride 1 only
    with pytest.raises(ValueError, match="does not apply"):
        run(op, ins, out_specs, gy, "backward", conv_algos.Algo("implicit", 1 << 20))
    op, ins, in_specs, out_specs, gy = make("3x3_odd_out", np.float32)
    y = np.empty(out_specs[0].shape, np.float32)
    with pytest.raises(ValueError, match="too small for the implicit forward"):
        _C.conv2d_implicit_forward(ins[0], ins[1], None, y, np.empty(10, np.float32), 1, 1, 1, 1, 1, 1)


# -------------------------------------------------------------- determinism
@pytest.mark.parametrize("case", ["s2_p1", "wide_row", "3x3_odd_out", "1x1", "depthwise"])
def test_deterministic(case):
    """Two runs are bitwise equal, whatever the workspace held before."""
    op, ins, in_specs, out_specs, gy = make(case, np.float32)
    for pass_ in ("forward", "backward"):
        for a in CONV.algorithms(op, in_specs, out_specs, pass_):
            first = run(op, ins, out_specs, gy, pass_, a, np.zeros(a.workspace, np.uint8))
            again = run(op, ins, out_specs, gy, pass_, a, np.full(a.workspace, 0xFF, np.uint8))
            for x, y in zip(first, again):
                assert x.tobytes() == y.tobytes(), f"{pass_} {a.name}"


@pytest.mark.parametrize("case,name", [("wide_s2", "direct"), ("wide_dil2_g2", "implicit"), ("3x3_odd_out", "implicit")])
def test_thread_count_independent(case, name):
    if name == "implicit" and not CONV.implicit:
        pytest.skip("this CPU has no AVX-512F")
    op, ins, in_specs, out_specs, gy = make(case, np.float32)
    n0 = _C.get_num_threads()
    res = []
    try:
        for t in (1, 2, 3):
            _C.set_num_threads(t)
            res.append([run(op, ins, out_specs, gy, p, [a for a in CONV.algorithms(op, in_specs, out_specs, p)
                                                        if a.name == name][0]) for p in ("forward", "backward")])
    finally:
        _C.set_num_threads(n0)
    for r in res[1:]:
        for x, y in zip(sum(r, []), sum(res[0], [])):
            assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_conv_transpose_direct_matches_im2col(dtype):
    r = rng_for("convT", np.dtype(dtype).name)
    for (s, p, op_, d, g) in [(2, 1, 1, 1, 1), (1, 0, 0, 2, 2), (3, 2, 2, 1, 1)]:
        op = ConvTranspose2dOp(s, p, op_, d, g)
        ins = [r.standard_normal((2, 4, 5, 6)).astype(dtype), r.standard_normal((4, 3, 3, 3)).astype(dtype),
               r.standard_normal(3 * g).astype(dtype)]
        in_specs = [Spec(a.shape, a.dtype) for a in ins]
        out_specs = op.infer(*in_specs)
        gy = r.standard_normal(out_specs[0].shape).astype(dtype)
        for pass_ in ("forward", "backward"):
            ref, alt = op.algorithms(in_specs, out_specs, pass_)
            assert (ref.name, alt.name, alt.workspace) == ("im2col", "direct", 0)
            for x, y in zip(run(op, ins, out_specs, gy, pass_, alt), run(op, ins, out_specs, gy, pass_, ref)):
                np.testing.assert_allclose(x, y, **tol(dtype, y))


# -------------------------------------------------------------------- cache
def _writer(path, i):
    c = AlgoCache(path)
    for j in range(20):
        c.put(f"key{i}-{j}", {"im2col": 0.1 * i, "direct": 0.2 + j})


def test_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIDNN_CACHE_DIR", str(tmp_path / "c"))
    c = AlgoCache()
    assert c.path == str(tmp_path / "c" / "algos.json")
    op, ins, in_specs, out_specs, gy = make("s2_p1", np.float32)
    k = c.key(op, in_specs, out_specs, "forward", "cpu")
    assert c.get(k) is None
    c.put(k, {"im2col": 1.5, "direct": 2.5})
    c.put(k, {"winograd": 0.5})
    assert AlgoCache().get(k) == {"im2col": 1.5, "direct": 2.5, "winograd": 0.5}
    # the key separates pass, dtype, backend and shape
    op64, _, s64, o64, _ = make("s2_p1", np.float64)
    others = {c.key(op, in_specs, out_specs, "backward", "cpu"), c.key(op64, s64, o64, "forward", "cpu"),
              c.key(op, in_specs, out_specs, "forward", "cuda"),
              c.key(Conv2dOp(1, 1), in_specs, out_specs, "forward", "cpu")}
    assert k not in others and len(others) == 4
    assert "cores" in k and '"float32"' in k


def test_cache_concurrent_writers(tmp_path):
    path = str(tmp_path / "algos.json")
    procs = [mp.get_context("fork").Process(target=_writer, args=(path, i)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    c = AlgoCache(path)
    for i in range(2):
        for j in range(20):
            assert c.get(f"key{i}-{j}") == {"im2col": 0.1 * i, "direct": 0.2 + j}


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", "\xff\xfe garbage"])
def test_corrupt_cache_is_ignored_with_a_warning(tmp_path, content):
    path = tmp_path / "algos.json"
    path.write_bytes(content.encode("latin-1"))
    c = AlgoCache(path)
    with pytest.warns(UserWarning, match="algos.json"):
        assert c.get("anything") is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c.put("k", {"direct": 1.0})       # the next write replaces the corrupt file
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert c.get("k") == {"direct": 1.0}


def test_profile_conv_uses_the_cache(tmp_path):
    from minidnn.backend.cpu import CPUBackend
    cache = AlgoCache(tmp_path / "algos.json")
    op, ins, in_specs, out_specs, gy = make("3x3_odd_out", np.float32)
    be = CPUBackend()
    for pass_ in ("forward", "backward"):
        t = profile_conv(op, in_specs, out_specs, pass_, be, repeats=1, cache=cache)
        assert set(t) == {a.name for a in be.conv.algorithms(op, in_specs, out_specs, pass_)}
        assert all(v > 0 for v in t.values())
        assert profile_conv(op, in_specs, out_specs, pass_, be, repeats=1, cache=cache) == t   # cached
    assert len(__import__("json").loads((tmp_path / "algos.json").read_text())) == 2


def test_profiling_keeps_the_fastest_run(monkeypatch):
    """Other load only adds time: the cache keeps an algorithm's fastest run, not one slowed by a busy
    moment (a median of runs on a busy machine was cached as the algorithm's speed for good)."""
    from minidnn import algo_cache
    clock = iter([0.0, 0.9, 1.0, 1.02, 2.0, 2.5])       # runs of 0.9 s, 0.02 s and 0.5 s
    monkeypatch.setattr(algo_cache.time, "perf_counter", lambda: next(clock))
    calls = []
    assert algo_cache._best_time(lambda: calls.append(1), 3) == pytest.approx(0.02)
    assert len(calls) == 4                                 # a warm-up run, then three timed
