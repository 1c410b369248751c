"""Convolution algorithms of the CPU backend, each with its own workspace and speed.

A forward algorithm is one name; a backward step computes the data and the
filter gradient, so its algorithm is a pair ``"data/filter"``, written as one
name when both halves are the same family (``"direct"`` = direct/direct).

========================  ==========================================  ==========================
name                      forward / backward-data / backward-filter   workspace
========================  ==========================================  ==========================
``im2col`` (default)      unfold the whole batch, one GEMM per group  C*kh*kw*N*L + O*N*L
``im2col_chunk{k}``       the same over chunks of k samples           proportional to k (+ one
                                                                      filter-sized partial)
``im2col_chunk{k}x{p}``   chunks of k on p lanes at once (one core    p times the chunk's (+ a
                          each, see backend.lanes)                    partial per extra lane and
                                                                      per lane with 2+ chunks)
``direct``                C++ direct convolution, all three passes    0
``gemm1x1``               1x1/stride 1/no padding: x is (C, H*W)      0 (backward-filter: one
                          per sample, NumPy matmul into the output    filter-sized partial)
``winograd``              F(2x2,3x3), 3x3 stride 1 groups 1, all      16*(O*C + C*P + O*P)
                          three passes (backward-data: padding <= 2): P = N*ceil(OH/2)*ceil(OW/2)
                          16 GEMMs over transformed tiles (C++        (backward-data: P of the
                          transforms, NumPy GEMMs)                    input plane)
``winograd4x4``           the same with F(4x4,3x3): 36 GEMMs, 2.25    36*(O*C + C*P + O*P)
                          multiplications per output instead of 4     P = N*ceil(OH/4)*ceil(OW/4)
``implicit``              float32, CPUs with AVX-512: an implicit     a zero-padded copy of the
                          GEMM over zero-padded planes (C++, FMA),    input (x in stride phases;
                          all three passes (backward-data: stride 1)  gy for the data pass; x in
                                                                      planes of 16 channels for
                                                                      the filter pass)
========================  ==========================================  ==========================

Every algorithm writes only its outputs and its workspace, is deterministic
run to run, and agrees with the others within float32 rounding. The lane
variants are the CPU backend's own (``Convolutions``, its ``conv``, lists them
for as many lanes as the kernels have threads and runs them on its ``Lanes``),
and so are ``implicit``, listed where this CPU runs it, and ``winograd4x4`` and
Winograd's filter-gradient pass, timed by a model of the CPU kernels
(``_winograd_speed``); ``Conv2dOp.algorithms``, what plans for a device profile
choose from, has none of them: its ``winograd`` is F(2x2,3x3) for the forward and
data passes, with the speed hint these plans have always used.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass

import numpy as np

from ..errors import BackendUnavailable
from .base import Algo, carve, nbytes_of

DEFAULT = "im2col"


@dataclass(frozen=True)
class Geom:
    """The shape of one convolution, read from specs or arrays."""

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    oh: int
    ow: int
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int
    dtype: np.dtype

    @classmethod
    def of(cls, op, x, w, y):
        return cls(*x.shape, w.shape[0], *w.shape[2:], *y.shape[2:], op.stride, op.padding,
                   op.dilation, op.groups, np.dtype(x.dtype))

    @property
    def l(self):
        return self.oh * self.ow

    @property
    def window(self):
        return (self.kh, self.kw, *self.stride, *self.padding, *self.dilation)

    @property
    def conv_args(self):
        return (*self.stride, *self.padding, *self.dilation, self.groups)

    @property
    def is_1x1(self):
        return (self.kh, self.kw) == (1, 1) and self.stride == (1, 1) and self.padding == (0, 0)

    @property
    def is_winograd(self):
        return ((self.kh, self.kw) == (3, 3) and self.stride == (1, 1) and self.dilation == (1, 1)
                and self.groups == 1)

    @property
    def winograd_data(self):   # backward-data as a Winograd conv padded by 2 - p
        return self.is_winograd and max(self.padding) <= 2

    @property
    def implicit(self):        # the C++ kernels: float32, taps of at most 32x32
        return self.dtype == np.float32 and self.direct

    @property
    def implicit_data(self):   # backward-data: stride 1, gy padded by d*(k-1) - p
        return self.implicit and self.stride == (1, 1) and all(
            p <= d * (k - 1) for p, d, k in zip(self.padding, self.dilation, (self.kh, self.kw)))

    @property
    def direct(self):          # the C++ kernel keeps per-row tap tables of 32 entries
        return self.kh <= 32 and self.kw <= 32


def chunk_sizes(n):
    """Chunk sizes listed for a batch of n: about n/2, n/4 and 1, each < n."""
    return sorted({k for k in (-(-n // 2), -(-n // 4), 1) if k < n}, reverse=True)


def split(name, pass_):
    """(data, filter) halves of a backward name; (name, None) for a forward one."""
    if pass_ == "forward":
        return name, None
    if pass_ != "backward":
        raise ValueError(f"pass must be 'forward' or 'backward', got {pass_!r}")
    if "/" in name:
        d, f = name.split("/", 1)
        return d, f
    return name, name


def _family(part):
    """('im2col', chunk or None, lanes) / ('direct', None, 1) / ...; ValueError if unknown."""
    if part == "im2col":
        return "im2col", None, 1
    if part.startswith("im2col_chunk"):
        k, _, p = part[len("im2col_chunk"):].partition("x")
        if k.isdigit() and int(k) >= 1 and (not p or p.isdigit() and int(p) >= 2):
            return "im2col", int(k), int(p or 1)
    if part in ("direct", "gemm1x1", "implicit") or part in WINOGRAD:
        return part, None, 1
    raise ValueError(f"unknown convolution algorithm {part!r}")


def _check(g: Geom, part, role):
    """(family, chunk size, lanes) of a part that applies to this layer and role."""
    fam, k, p = _family(part)
    ok = {"im2col": True, "direct": g.direct, "gemm1x1": g.is_1x1,
          "implicit": g.implicit_data if role == "data" else g.implicit,
          **dict.fromkeys(WINOGRAD, g.winograd_data if role == "data" else g.is_winograd)}[fam]
    if not ok:
        raise ValueError(f"convolution algorithm {part!r} does not apply to the {role} pass of this layer "
                         f"(kernel {g.kh}x{g.kw}, stride {g.stride}, padding {g.padding}, "
                         f"dilation {g.dilation}, groups {g.groups})")
    return fam, (min(k, g.n) if k else g.n), p


# ------------------------------------------------------------------ workspaces
def _cols(g, k):
    return [((g.c * g.kh * g.kw, k * g.l), g.dtype), ((g.o, k * g.l), g.dtype)]


def _partials(g):   # a filter-sized and a bias-sized partial sum, for chunked filter gradients
    return [((g.o, g.c // g.groups * g.kh * g.kw), g.dtype), ((g.o,), g.dtype)]


WINOGRAD = {"winograd": 2, "winograd4x4": 4}   # family -> m of F(mxm, 3x3)


def _wino(g, m, role):
    """The Winograd workspace: the transformed filter, input and output of the forward (U, V, M),
    of the data pass (U of the turned filters, gy's V, gx's M), or of the filter pass (Z of gy,
    V of x, D of the filter gradient), each with (m + 2)^2 points."""
    t = (m + 2) ** 2
    tiles = g.n * -(-(g.h if role == "data" else g.oh) // m) * -(-(g.w if role == "data" else g.ow) // m)
    shapes = {"forward": [(t, g.o, g.c), (t, g.c, tiles), (t, g.o, tiles)],
              "data": [(t, g.o, g.c), (t, g.o, tiles), (t, g.c, tiles)],    # U of the turned filters
              "filter": [(t, g.o, tiles), (t, g.c, tiles), (t, g.o, g.c)]}[role]
    return [(s, g.dtype) for s in shapes]


def _implicit_rows(g, role):
    """(rows, width, width of the padded rows) of the plane the implicit forward or data pass
    writes; the forward's padded rows are split into stride phases."""
    if role == "forward":
        return g.oh, g.ow, -(-(g.w + 2 * g.padding[1]) // g.stride[1])
    return g.h, g.w, g.ow + 2 * (g.dilation[1] * (g.kw - 1) - g.padding[1])


def _implicit_channels(g, role):
    """Whether the implicit kernels vectorize over output channels (planes whose padded rows would
    leave more than 1/8 of each vector of 16 positions empty) rather than over positions."""
    rows, width, wp = _implicit_rows(g, role)
    return 8 * rows * width < 7 * 16 * -(-rows * wp // 16)


def _implicit(g, role):
    """The implicit convolution's workspace, as its kernels size it: a zero-padded copy of its input
    (x in stride phases, or gy padded by d*(k-1) - p) with the vector loads' slack, the partial sums
    where channels are vectorized, and the filter laid out for the kernel; or, for the filter pass,
    x as padded planes of 16 channels."""
    from .. import _C
    role_index = {"forward": 0, "data": 1, "filter": 2}[role]
    return [((_C.conv2d_implicit_workspace(g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, *g.conv_args, role_index),),
             g.dtype)]


def _lane_chunks(n, k, p):
    """Per lane, the (start, end) sample ranges of its chunks: chunk i goes to lane i mod p."""
    chunks = _chunks(n, k)
    return [chunks[j::p] for j in range(min(p, len(chunks)))]


def _lane_partials(n, k, p):
    """Filter-sized partial sums of a lanes pass: lanes after the first accumulate into their
    own, and a lane with several chunks needs one more for each chunk's product."""
    lanes = _lane_chunks(n, k, p)
    return len(lanes) - 1 + sum(len(c) > 1 for c in lanes)


def _scratch(g, fam, k, p, role):
    """The (shape, dtype) list a part carves from the workspace."""
    if fam == "im2col":
        lanes = len(_lane_chunks(g.n, k, p))
        return _cols(g, k) * lanes + (_partials(g) * _lane_partials(g.n, k, p) if role == "filter" else [])
    if fam in WINOGRAD:
        return _wino(g, WINOGRAD[fam], role)
    if fam == "implicit":
        return _implicit(g, role)
    if fam == "gemm1x1" and role == "filter" and g.n > 1:
        return _partials(g)[:1]
    return []


def part_workspace(g: Geom, part, role) -> int:
    """Bytes one half of a pass needs alone (role: "forward", "data" or "filter")."""
    return nbytes_of(_scratch(g, *_check(g, part, role), role))


def workspace(g: Geom, name, pass_) -> int:
    """Bytes of workspace the named algorithm needs for this pass (ValueError if unknown)."""
    d, f = split(name, pass_)
    if f is None:
        return nbytes_of(_scratch(g, *_check(g, d, "forward"), "forward"))
    data, filt = _check(g, d, "data"), _check(g, f, "filter")
    if data[0] == "im2col" and data == filt:     # one pass shares the transposed gradient
        return nbytes_of(_scratch(g, *filt, "filter"))
    return max(nbytes_of(_scratch(g, *data, "data")), nbytes_of(_scratch(g, *filt, "filter")))


def default_lanes() -> int:
    """The lanes the CPU backend runs on: one per thread of its kernels (1 where they are not built)."""
    try:
        from .. import _C
    except ImportError:
        return 1
    return _C.get_num_threads()


def lane_chunk_sizes(n, p):
    """Chunk sizes listed for a batch of n on p lanes: one chunk per lane, two, and single samples."""
    per = -(-n // p)
    return sorted({k for k in (per, -(-per // 2), 1) if k < n}, reverse=True) if p > 1 else []


def names(g: Geom, pass_, lanes=1, implicit=False, cpu=False):
    """The algorithm names that apply to this layer and pass on ``lanes`` lanes, the default first;
    ``implicit`` where this CPU runs it; ``cpu``: the CPU backend's own set (Winograd F(2x2) and
    F(4x4), all three passes), else the portable one (F(2x2,3x3) for the forward and data passes)."""
    chunks = ([f"im2col_chunk{k}" for k in chunk_sizes(g.n)]
              + [f"im2col_chunk{k}x{lanes}" for k in lane_chunk_sizes(g.n, lanes)])
    zero = (["direct"] if g.direct else []) + (["gemm1x1"] if g.is_1x1 else [])
    wino = list(WINOGRAD) if cpu else ["winograd"]
    if pass_ == "forward":
        return (["im2col"] + chunks + zero + (wino if g.is_winograd else [])
                + (["implicit"] if implicit and g.implicit else []))
    if pass_ != "backward":
        raise ValueError(f"pass must be 'forward' or 'backward', got {pass_!r}")
    data = (["im2col"] + chunks + zero + (wino if g.winograd_data else [])
            + (["implicit"] if implicit and g.implicit_data else []))
    filt = (["im2col"] + chunks + zero + (wino if cpu and g.is_winograd else [])
            + (["implicit"] if implicit and g.implicit else []))
    out = []
    for d in data:
        for f in filt:
            if d != f and d.startswith("im2col") and f.startswith("im2col"):
                continue              # dominated by the pair with one chunk size
            if d == f:
                out.append(d)
            else:
                out.append(f"{d}/{f}")
    return out


@functools.lru_cache(maxsize=1024)   # a pure function of the shape; deep networks repeat few shapes
def algorithms(g: Geom, pass_, lanes=1, implicit=False, cpu=False):
    return [Algo(n, workspace(g, n, pass_), speed(g, n, pass_, cpu)) for n in names(g, pass_, lanes, implicit, cpu)]


def implicit_available() -> bool:
    """Whether this CPU runs the ``implicit`` algorithm (AVX-512F and the built kernels)."""
    try:
        from .. import _C
    except ImportError:
        return False
    return _C.conv2d_implicit_available()


# Time relative to the default, for cost models that do not measure: rounded
# single-thread medians of scripts/bench_conv_cpu.py on ResNet-18 and VGG-16
# layers (2-core AMD EPYC, float32); profile_conv measures the real thing.
_SPEED = {"forward": {"im2col": 1.0, "direct": 1.6, "gemm1x1": 0.8, "winograd": 0.85},
          "data": {"im2col": 1.0, "direct": 1.9, "gemm1x1": 0.8, "winograd": 0.9},
          "filter": {"im2col": 1.0, "direct": 3.0, "gemm1x1": 1.0}}


def _lane_speed(g, role):
    """im2col on lanes relative to one multithreaded GEMM: faster on large planes, slower on
    small ones, where each lane's filter-sized partial sums outweigh the GEMMs."""
    plane = g.oh * g.ow
    if plane >= 16 * 16:
        return 0.75
    if plane >= 8 * 8:
        return 1.2 if role == "filter" else 0.9
    return 1.6 if role == "filter" else 1.1


def _implicit_speed(g, role):
    """The implicit kernels relative to im2col (medians of scripts/bench_conv_cpu.py and of per-step
    profiles of ResNet-18, 2-core AVX-512 Xeon): about twice as fast where a plane's rows fill the
    vectors of 16 positions (forward, data) or the planes are large (filter), slower as more of
    each vector is padding, on small planes (vectors of channels), or with fewer than 16 channels
    to sum or to fill the vectors."""
    cg, og = g.c // g.groups, g.o // g.groups
    strided = 1.6 if g.stride != (1, 1) else 1.0    # the phase split; measured no faster than lanes
    if role == "filter":
        filled = cg / (16 * -(-cg // 16))
        return (0.55 if g.oh * g.ow >= 16 * 16 else 1.3) / filled * strided
    rows, width, wp = _implicit_rows(g, role)
    if _implicit_channels(g, role):
        sp = 1.0 if rows * width >= 8 * 8 else 1.3
    else:
        sp = 0.5 / (rows * width / (16 * -(-rows * wp // 16))) ** 2
    return sp * (2.0 if (cg if role == "forward" else og) < 16 else 1.0) * strided


def _winograd_speed(g, m, role):
    """Winograd F(mxm, 3x3) relative to im2col (fits to scripts/bench_conv_cpu.py and to A/B runs of
    ResNet-18 steps, 2-core AVX-512 Xeon): its GEMMs run at about twice im2col's rate where they sum
    over 128 or more channels (or tiles, in the filter pass), at im2col's below; each element of
    the transformed filter, input and output costs the time of about 60 of im2col's flops, up to
    twice that on planes of few tiles, where each plane's own overhead weighs."""
    shapes = [s for s, _ in _wino(g, m, role)]
    tiles = shapes[0][2] if role == "filter" else shapes[1][2]
    inner = {"forward": g.c, "data": g.o, "filter": tiles}[role]
    gemm = 2.0 * (m + 2) ** 2 * g.o * g.c * tiles * (0.53 if inner >= 128 else 1.0)
    elements = sum(int(np.prod(s)) for s in shapes)
    per_element = 60.0 * (1 + 4 * g.n / tiles)          # tiles / g.n: the tiles of one plane
    return (gemm + per_element * elements) / (2.0 * g.n * g.o * g.c * 9 * g.oh * g.ow)


def _part_speed(g, part, role, cpu):
    fam, k, p = _family(part)
    if fam == "implicit":
        return _implicit_speed(g, role)
    if fam in WINOGRAD and cpu:
        return _winograd_speed(g, WINOGRAD[fam], role)
    sp = _SPEED[role][fam]
    if fam == "im2col" and k is not None and k < g.n:
        sp *= 1.0 + 0.1 * (k == 1 and g.n >= 8)   # many small GEMMs
        if cpu and k * g.l < 256:
            sp *= 1.3                             # GEMMs over fewer than 256 columns (VGG-11: 2x2 planes)
    if p > 1:
        sp *= _lane_speed(g, role)
    if fam == "direct" and g.stride != (1, 1):
        sp *= 1.8                                 # strided loads
    if fam == "winograd":                         # the transforms dominate on small planes, few channels
        sp *= (1.0 if g.oh * g.ow >= 28 * 28 else 1.4 if g.oh * g.ow >= 14 * 14 else 3.0)
        sp *= 4.0 if min(g.c, g.o) < 16 else 1.0
    return sp


def speed(g: Geom, name, pass_, cpu=False) -> float:
    """A rough time of the named algorithm relative to the default (1.0); ``cpu``: from the models
    of the CPU backend's kernels, else the hints plans for device profiles have always used."""
    d, f = split(name, pass_)
    if f is None:
        return _part_speed(g, d, "forward", cpu)
    return 0.5 * (_part_speed(g, d, "data", cpu) + _part_speed(g, f, "filter", cpu))


# ------------------------------------------------------------------ the passes
def _chunks(n, k):
    return [(a, min(a + k, n)) for a in range(0, n, k)]


def _prefix(a, shape):
    """The first prod(shape) elements of the contiguous array ``a``, as ``shape``."""
    return a.reshape(-1)[:int(np.prod(shape))].reshape(shape)


def _run_lanes(lanes, p, fn):
    """fn(0), ..., fn(p - 1): in this thread for one lane, else side by side on ``lanes``."""
    if p == 1:
        fn(0)
    elif lanes is None:
        raise ValueError(f"a convolution algorithm on {p} lanes needs the CPU backend's lanes "
                         f"(conv_algos.Convolutions)")
    else:
        lanes.run(fn, p)


def forward(op, k, x, w, b, y, ws, name, lanes=None):
    g = Geom.of(op, x, w, y)
    fam, kc, p = _check(g, name or DEFAULT, "forward")
    if fam == "im2col":
        work = _lane_chunks(g.n, kc, p)
        bufs = carve(ws, _cols(g, kc) * len(work))
        gr = g.groups

        def lane(j):
            for a, e in work[j]:
                (cs, _), (ys, _) = _cols(g, e - a)
                cols, yt = _prefix(bufs[2 * j], cs), _prefix(bufs[2 * j + 1], ys)
                k.im2col(x[a:e], cols, *g.window)
                np.matmul(w.reshape(gr, g.o // gr, -1), cols.reshape(gr, cols.shape[0] // gr, -1),
                          out=yt.reshape(gr, g.o // gr, -1))
                k.cn_to_nchw(yt, y[a:e], False)
        _run_lanes(lanes, len(work), lane)
        if b is not None:
            k.conv2d_add_bias(y, b)
    elif fam == "direct":
        k.conv2d_direct_forward(x, w, b, y, *g.conv_args)
    elif fam == "implicit":
        k.conv2d_implicit_forward(x, w, b, y, carve(ws, _implicit(g, "forward"))[0], *g.conv_args)
    elif fam == "gemm1x1":
        gr = g.groups
        np.matmul(w.reshape(gr, g.o // gr, g.c // gr), x.reshape(g.n, gr, g.c // gr, g.h * g.w),
                  out=y.reshape(g.n, gr, g.o // gr, g.l))
        if b is not None:
            k.conv2d_add_bias(y, b)
    else:  # winograd: M[t] = U[t] V[t]
        mt = WINOGRAD[fam]
        u, v, m = carve(ws, _wino(g, mt, "forward"))
        k.winograd_filter_transform(w, u, False, mt)
        k.winograd_input_transform(x, v, *g.padding, mt)
        np.matmul(u, v, out=m)
        k.winograd_output_transform(m, y, b, mt)


def backward(op, k, x, w, gy, gx, gw, gb, ws, name, lanes=None):
    """Overwrite gx, gw, gb (each may be None) with the gradients given gy."""
    g = Geom.of(op, x if x is not None else gx, w, gy)
    d, f = split(name or DEFAULT, "backward")
    (fd, kd, pd), (ff, kf, pf) = _check(g, d, "data"), _check(g, f, "filter")
    want_data, want_filter = gx is not None, gw is not None or gb is not None
    if fd == ff == "im2col" and (kd, pd) == (kf, pf) and want_data and want_filter:
        _im2col_backward(g, k, x, w, gy, gx, gw, gb, ws, kf, pf, lanes)
        return
    if want_data:
        if fd == "im2col":
            _im2col_backward(g, k, None, w, gy, gx, None, None, ws, kd, pd, lanes)
        elif fd == "direct":
            k.conv2d_direct_backward_data(gy, w, gx, *g.conv_args)
        elif fd == "implicit":
            k.conv2d_implicit_backward_data(gy, w, gx, carve(ws, _implicit(g, "data"))[0], *g.conv_args)
        elif fd == "gemm1x1":
            gr = g.groups
            w3 = w.reshape(gr, g.o // gr, g.c // gr)
            np.matmul(w3.transpose(0, 2, 1), gy.reshape(g.n, gr, g.o // gr, g.l),
                      out=gx.reshape(g.n, gr, g.c // gr, g.h * g.w))
        else:  # winograd: the gradient is a Winograd conv of gy by the turned, transposed filter
            mt = WINOGRAD[fd]
            u, v, m = carve(ws, _wino(g, mt, "data"))
            k.winograd_filter_transform(w, u, True, mt)
            k.winograd_input_transform(gy, v, 2 - g.padding[0], 2 - g.padding[1], mt)
            np.matmul(u.transpose(0, 2, 1), v, out=m)
            k.winograd_output_transform(m, gx, None, mt)
    if want_filter:
        if ff == "im2col":
            _im2col_backward(g, k, x, None, gy, None, gw, gb, ws, kf, pf, lanes)
        elif ff in WINOGRAD:   # D[t] = Z[t] V[t]^T, Z: gy's tiles, V: x's
            if gw is not None:
                mt = WINOGRAD[ff]
                z, v, dt = carve(ws, _wino(g, mt, "filter"))
                k.winograd_gradient_transform(gy, z, mt)
                k.winograd_input_transform(x, v, *g.padding, mt)
                np.matmul(z, v.transpose(0, 2, 1), out=dt)
                k.winograd_filter_gradient(dt, gw, mt)
            if gb is not None:
                k.conv2d_bias_grad(gy, gb)
        elif ff in ("direct", "implicit"):
            if gw is not None and ff == "direct":
                k.conv2d_direct_backward_filter(x, gy, gw, *g.conv_args)
            elif gw is not None:
                k.conv2d_implicit_backward_filter(x, gy, gw, carve(ws, _implicit(g, "filter"))[0],
                                                  *g.conv_args)
            if gb is not None:
                k.conv2d_bias_grad(gy, gb)
        else:  # gemm1x1: one GEMM per sample, summed in sample order
            if gw is not None:
                gr = g.groups
                x4 = x.reshape(g.n, gr, g.c // gr, g.l)
                gy4 = gy.reshape(g.n, gr, g.o // gr, g.l)
                gw3 = gw.reshape(gr, g.o // gr, g.c // gr)
                part = carve(ws, _partials(g)[:1])[0].reshape(gw3.shape) if g.n > 1 else None
                for i in range(g.n):
                    np.matmul(gy4[i], x4[i].transpose(0, 2, 1), out=gw3 if i == 0 else part)
                    if i:
                        gw3 += part
            if gb is not None:
                k.conv2d_bias_grad(gy, gb)


def _im2col_backward(g, k, x, w, gy, gx, gw, gb, ws, kc, p, lanes):
    """im2col backward over chunks of kc samples on p lanes; computes what is not None.

    Lane j takes chunks j, j + p, ...; its filter gradient sums its chunks in
    order (into gw, gb for lane 0, into partials for the others), and the
    lanes' sums are added to lane 0's in lane order.
    """
    gr, o = g.groups, g.o
    work = _lane_chunks(g.n, kc, p)
    want_filter = gw is not None or gb is not None
    bufs = carve(ws, _cols(g, kc) * len(work) + _partials(g) * (_lane_partials(g.n, kc, p) if want_filter else 0))
    cols_of, parts = bufs[:2 * len(work)], bufs[2 * len(work):]
    acc, tmp = [(gw, gb)], []
    for j, chunks in enumerate(work if want_filter else ()):   # each lane's sum, its scratch for more chunks
        if j:
            acc.append((parts.pop(0), parts.pop(0)))
        tmp.append((parts.pop(0), parts.pop(0)) if len(chunks) > 1 else None)

    def lane(j):
        for ci, (a, e) in enumerate(work[j]):
            (cs, _), (ys, _) = _cols(g, e - a)
            cols, gyt = _prefix(cols_of[2 * j], cs), _prefix(cols_of[2 * j + 1], ys)
            k.nchw_to_cn(gy[a:e], gyt)
            gyt3 = gyt.reshape(gr, o // gr, -1)
            if want_filter:
                sw, sb = acc[j] if ci == 0 else tmp[j]
                if gb is not None:
                    np.sum(gyt, axis=1, out=sb)
                    if ci:
                        acc[j][1][...] += sb
                if gw is not None:
                    k.im2col(x[a:e], cols, *g.window)
                    cols3 = cols.reshape(gr, cols.shape[0] // gr, -1)
                    np.matmul(gyt3, cols3.transpose(0, 2, 1), out=sw.reshape(gr, o // gr, -1))
                    if ci:
                        acc[j][0][...] += sw.reshape(acc[j][0].shape)
            if gx is not None:
                w3 = w.reshape(gr, o // gr, -1)
                np.matmul(w3.transpose(0, 2, 1), gyt3, out=cols.reshape(gr, cols.shape[0] // gr, -1))
                k.col2im(cols, gx[a:e], *g.window)
    _run_lanes(lanes, len(work), lane)
    for pw, pb in acc[1:]:
        if gw is not None:
            gw += pw.reshape(gw.shape)
        if gb is not None:
            gb += pb


class Convolutions:
    """The CPU backend's convolution algorithms, with the lanes that run their lane variants."""

    def __init__(self, lanes, implicit=None, winograd=True):
        """``implicit``: list the implicit algorithm (None: where this CPU runs it); ``winograd``: list
        the Winograd algorithms (F(2x2,3x3) and F(4x4,3x3), every pass)."""
        self.lanes = lanes
        if implicit and not implicit_available():
            raise BackendUnavailable("the implicit convolution needs a CPU with AVX-512F and minidnn's built "
                                     "kernels; this one has not")
        self.implicit = implicit_available() if implicit is None else bool(implicit)
        self.winograd = bool(winograd)

    def algorithms(self, op, in_specs, out_specs, pass_) -> list:
        """``op``'s algorithms on this backend: a Conv2d's lane variants too."""
        if op.name != "conv2d":
            return op.algorithms(in_specs, out_specs, pass_)
        return op.staged_algorithms(lambda ins, outs, p: self._conv2d(op, ins, outs, p), in_specs, out_specs, pass_)

    def _conv2d(self, op, in_specs, out_specs, pass_):
        algos = algorithms(Geom.of(op, in_specs[0], in_specs[1], out_specs[0]), pass_, default_lanes(),
                           self.implicit, cpu=True)
        return algos if self.winograd else [a for a in algos if not WINOGRAD.keys() & set(split(a.name, pass_))]

    def forward(self, op, k, x, w, b, y, ws, name):
        forward(op, k, x, w, b, y, ws, name, self.lanes)

    def backward(self, op, k, x, w, gy, gx, gw, gb, ws, name):
        backward(op, k, x, w, gy, gx, gw, gb, ws, name, self.lanes)
