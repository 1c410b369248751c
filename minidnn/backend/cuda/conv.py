"""Convolutions on the CUDA backend: cuDNN's algorithms, with the interface of ``ops.conv_algos``.

Names are cuDNN's enumerators without their prefix: a forward algorithm is
one (``"IMPLICIT_PRECOMP_GEMM"``), a backward step is a pair
``"data/filter"`` (``"ALGO_1/ALGO_1"``) whose halves run one after the other
in one workspace, so its workspace is the larger of the two. :meth:`algorithms`
lists, for a layer and pass, the algorithms cuDNN supports with the workspace
cuDNN asks for and the time cuDNN's Find measured (fastest first; backward
pairs on the time/workspace Pareto front), as ``ops.base.Algo``s: the planner
trades them exactly as it trades the CPU algorithms. With ``deterministic``
only deterministic algorithms are listed, so that a run under a budget stays
bitwise identical to the unlimited run.

``algo=None`` runs the first algorithm of cuDNN's heuristics whose workspace
fits the buffer handed in (chosen once per layer, pass and buffer size).

Mixed precision's layers (bfloat16 and float16 data and filters) run with
cuDNN's BFLOAT16 and HALF tensor types, FLOAT compute and tensor-op math (the
binding sets all three from the dtype); Find, the cache, the heuristics'
choice and every workspace are per dtype (a ``Geom`` holds it), so a layer's
bf16 algorithms and workspaces are its own, never its fp32 ones.

Find lists an algorithm once per math type it tried (with TF32: the FMA and
the tensor-op variant); each algorithm keeps its fastest variant, and a call
sets that variant's math type on the descriptor, so the plan runs what was timed
with the workspace that was measured. Find's results (time, workspace, math
type) go to the on-disk algorithm cache the CPU's measurements use
(``minidnn.algo_cache``), keyed by layer, pass, GPU and cuDNN version: every
trainer of the machine then sees the same results and plans the same algorithms
with the same workspaces, whether Find ran or the cache answered (Find's timing
noise would otherwise let two runs of one model pick different algorithms and
differ in the last bits). Find's scratch arrays go back to CuPy's pool's owner
(the driver) when it is done, so they hold no device memory beside the arena.
"""
from __future__ import annotations

import json

import cupy as cp
import numpy as np

from ...ops.base import Algo
from ...ops.conv_algos import Geom

FIND_WORKSPACE_CAP = 1 << 30    # the most workspace Find may try an algorithm with


def _nbytes(ws):
    return 0 if ws is None else int(ws.nbytes)


def _ptr(a):
    return 0 if a is None or a.size == 0 else a.data.ptr


def _normal(rng, shape, dtype):
    """Standard normal values of ``dtype`` (CuPy draws float32 and float64; 16-bit ones are rounded from float32)."""
    wide = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    return rng.standard_normal(shape, dtype=wide).astype(dtype, copy=False)


class CudnnConv:
    """cuDNN convolutions on one handle (bound to the backend's compute stream)."""

    def __init__(self, cudnn, handle, tf32=False, deterministic=True, cache=None, device_name=""):
        """``cache``: an ``algo_cache.AlgoCache`` for Find's times (None: measure every time)."""
        self.cudnn, self.handle = cudnn, handle
        self.tf32, self.deterministic = tf32, deterministic
        self.cache, self.device_name = cache, device_name
        self._descs = {}      # Geom -> cudnn.Conv
        self._found = {}      # (Geom, pass) -> {name: (Algo, seconds)}
        self._math = {}       # (Geom, role, algorithm name) -> the math type Find timed it with
        self._picked = {}     # (Geom, role, name, workspace bytes) -> (algorithm, math type) of a call

    # -- descriptors -----------------------------------------------------
    def desc(self, g: Geom):
        d = self._descs.get(g)
        if d is None:
            d = self.cudnn.Conv(g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, *g.stride, *g.padding, *g.dilation, g.groups,
                                np.dtype(g.dtype).name, self.tf32)
            if tuple(d.output_shape[2:]) != (g.oh, g.ow):
                raise ValueError(f"cuDNN computes a {tuple(d.output_shape)} output, minidnn expects "
                                 f"{(g.n, g.o, g.oh, g.ow)}")
            self._descs[g] = d
        return d

    @staticmethod
    def transposed_geom(op, x, w, y):
        """The convolution whose backward-data is this transposed convolution: from y to x."""
        return Geom(y.shape[0], y.shape[1], y.shape[2], y.shape[3], x.shape[1], w.shape[2], w.shape[3],
                    x.shape[2], x.shape[3], op.stride, op.padding, op.dilation, op.groups, np.dtype(x.dtype))

    # -- algorithm lists ------------------------------------------------
    def _usable(self, perfs):
        ok = self.cudnn.STATUS_SUCCESS
        return [p for p in perfs if p[1] == ok and (p[4] or not self.deterministic)]

    def _find(self, g: Geom, pass_):
        """{name: (workspace, seconds, math type)} per half ("forward", "data", "filter"), measured by Find."""
        d, h = self.desc(g), self.handle
        rng = cp.random.default_rng(0)
        x = _normal(rng, (g.n, g.c, g.h, g.w), g.dtype)
        w = _normal(rng, (g.o, g.c // g.groups, g.kh, g.kw), g.dtype)
        y = _normal(rng, (g.n, g.o, g.oh, g.ow), g.dtype)
        cp.cuda.Device().synchronize()      # Find runs on the handle's stream, not the one that filled them
        out = {}
        roles = [("forward", self.cudnn.FWD_ALGOS, d.forward_workspace, d.find_forward, (x, w, y))] \
            if pass_ == "forward" else \
            [("data", self.cudnn.BWD_DATA_ALGOS, d.backward_data_workspace, d.find_backward_data, (w, y, x)),
             ("filter", self.cudnn.BWD_FILTER_ALGOS, d.backward_filter_workspace, d.find_backward_filter, (x, y, w))]
        for role, names, ws_of, find, bufs in roles:
            sizes = [ws_of(h, a) for a in range(len(names))]
            cap = min(FIND_WORKSPACE_CAP, max([s for s in sizes if s is not None] or [0]))
            ws = cp.empty(cap, np.uint8)
            out[role] = fastest_variants(self._usable(find(h, *map(_ptr, bufs), _ptr(ws), cap)), names)
            del ws
        cp.cuda.get_current_stream().synchronize()
        del x, w, y
        # Find's scratch (up to FIND_WORKSPACE_CAP and three layer-sized arrays) would otherwise stay in
        # CuPy's pool, device memory held beside the arena that no plan counts
        cp.get_default_memory_pool().free_all_blocks()
        return out

    def _cache_key(self, g: Geom, pass_) -> str:
        # v3: 16-bit layers are timed with tensor-op math (v2 timed float16 with the fp32 layers' FMA)
        return json.dumps({"v": 3, "op": "conv2d", "pass": pass_, "backend": "cuda", "device": self.device_name,
                           "cudnn": self.cudnn.version(), "tf32": self.tf32, "deterministic": self.deterministic,
                           "geom": [g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.oh, g.ow, list(g.stride),
                                    list(g.padding), list(g.dilation), g.groups], "dtype": np.dtype(g.dtype).name},
                          sort_keys=True, separators=(",", ":"))

    def _halves(self, g: Geom, pass_):
        """Find's {role: {name: (workspace, seconds, math type)}}, from the cache when it has this layer.

        The cache holds exactly what Find returned, workspaces included, so that a layer plans the
        same whether Find ran in this process or an earlier one did."""
        key = self._cache_key(g, pass_) if self.cache else None
        hit = self.cache.get(key) if self.cache else None
        roles = ("forward",) if pass_ == "forward" else ("data", "filter")
        names = {"forward": self.cudnn.FWD_ALGOS, "data": self.cudnn.BWD_DATA_ALGOS,
                 "filter": self.cudnn.BWD_FILTER_ALGOS}
        if hit:      # the cache's entries are numbers: "role:name" seconds, ":ws" bytes, ":math" math type
            out = {r: {} for r in roles}
            for k, t in hit.items():
                role, name = k.split(":", 1)
                ws, math = hit.get(f"{k}:ws"), hit.get(f"{k}:math")
                if role in out and name in names[role] and ws is not None and math is not None:
                    out[role][name] = (int(ws), float(t), int(math))
            if all(out[r] for r in roles):
                return out
        out = self._find(g, pass_)
        if self.cache:
            entry = {}
            for r in out:
                for n, (ws, t, math) in out[r].items():
                    entry.update({f"{r}:{n}": t, f"{r}:{n}:ws": ws, f"{r}:{n}:math": math})
            self.cache.put(key, entry)
        return out

    def timed(self, g: Geom, pass_) -> dict:
        """{name: (Algo, seconds)} for ``pass_``, fastest first (Find runs once per layer shape and GPU)."""
        key = (g, pass_)
        if key not in self._found:
            halves = self._halves(g, pass_)
            for role, found in halves.items():
                for n, (_, _, math) in found.items():
                    self._math[(g, role, n)] = math
            if pass_ == "forward":
                items = [(n, ws, t) for n, (ws, t, _) in halves["forward"].items()]
            else:
                items = _pareto_pairs({n: v[:2] for n, v in halves["data"].items()},
                                      {n: v[:2] for n, v in halves["filter"].items()})
            items.sort(key=lambda it: (it[2], it[1]))
            if not items:
                raise RuntimeError(f"cuDNN offers no usable {pass_} algorithm for {g}")
            best = items[0][2] or 1e-9
            self._found[key] = {n: (Algo(n, int(ws), t / best), t) for n, ws, t in items}
        return self._found[key]

    def algorithms(self, op, in_specs, out_specs, pass_) -> list:
        return [a for a, _ in self.timed(Geom.of(op, in_specs[0], in_specs[1], out_specs[0]), pass_).values()]

    def seconds(self, op, in_specs, out_specs, pass_, name):
        hit = self.timed(Geom.of(op, in_specs[0], in_specs[1], out_specs[0]), pass_).get(name)
        return None if hit is None else hit[1]

    # -- choosing the algorithm of a call ---------------------------------
    def _pick(self, g, d, role, name, ws):
        """(algorithm, math type) of a call: the named one with the math type Find timed it with, or
        the heuristics' first that fits ``ws``; worked out once per layer, pass and workspace size
        (the heuristics and workspace queries are host calls into cuDNN, not free per step)."""
        key = (g, role, name, _nbytes(ws))
        hit = self._picked.get(key)
        if hit is None:
            hit = self._picked[key] = self._choose(g, d, role, name, _nbytes(ws))
        return hit

    def _choose(self, g, d, role, name, nbytes):
        names = {"forward": self.cudnn.FWD_ALGOS, "data": self.cudnn.BWD_DATA_ALGOS,
                 "filter": self.cudnn.BWD_FILTER_ALGOS}[role]
        if name is not None:
            if name not in names:
                raise ValueError(f"unknown cuDNN {role} algorithm {name!r} (one of {', '.join(names)}); plans for "
                                 f"the cuda backend name cuDNN's algorithms")
            return names.index(name), self._math.get((g, role, name), -1)
        heur = {"forward": d.forward_heuristics, "data": d.backward_data_heuristics,
                "filter": d.backward_filter_heuristics}[role](self.handle)
        ws_of = {"forward": d.forward_workspace, "data": d.backward_data_workspace,
                 "filter": d.backward_filter_workspace}[role]
        for p in self._usable(heur):
            need = ws_of(self.handle, p[0], p[6])
            if need is not None and need <= nbytes:
                return p[0], p[6]
        raise RuntimeError(f"no cuDNN {role} algorithm fits a workspace of {nbytes} bytes")

    # -- the passes, with ops.conv_algos' signatures ------------------------
    def forward(self, op, k, x, w, b, y, ws, name):
        g = Geom.of(op, x, w, y)
        d = self.desc(g)
        algo, math = self._pick(g, d, "forward", name, ws)
        d.forward(self.handle, _ptr(x), _ptr(w), _ptr(y), algo, _ptr(ws), _nbytes(ws), math=math)
        if b is not None:
            k.conv2d_add_bias(y, b)

    def backward(self, op, k, x, w, gy, gx, gw, gb, ws, name):
        g = Geom.of(op, x if x is not None else gx, w, gy)
        d = self.desc(g)
        dn, fn = name.split("/", 1) if name else (None, None)
        if gb is not None:
            k.conv2d_bias_grad(gy, gb)
        if gw is not None:
            algo, math = self._pick(g, d, "filter", fn, ws)
            d.backward_filter(self.handle, _ptr(x), _ptr(gy), _ptr(gw), algo, _ptr(ws), _nbytes(ws), math=math)
        if gx is not None:
            algo, math = self._pick(g, d, "data", dn, ws)
            d.backward_data(self.handle, _ptr(w), _ptr(gy), _ptr(gx), algo, _ptr(ws), _nbytes(ws), math=math)

    # ConvTranspose2d: its forward is the backward-data of the convolution from its output to its
    # input, its backward-data that convolution's forward, its filter gradient that one's.
    def transpose_forward(self, op, k, x, w, b, y, ws):
        g = self.transposed_geom(op, x, w, y)
        d = self.desc(g)
        algo, math = self._pick(g, d, "data", None, ws)
        d.backward_data(self.handle, _ptr(w), _ptr(x), _ptr(y), algo, _ptr(ws), _nbytes(ws), math=math)
        if b is not None:
            k.conv2d_add_bias(y, b)

    def transpose_backward(self, op, k, x, w, gy, gx, gw, gb, ws):
        g = self.transposed_geom(op, x if x is not None else gx, w, gy)
        d = self.desc(g)
        if gb is not None:
            k.conv2d_bias_grad(gy, gb)
        if gw is not None:
            algo, math = self._pick(g, d, "filter", None, ws)
            d.backward_filter(self.handle, _ptr(gy), _ptr(x), _ptr(gw), algo, _ptr(ws), _nbytes(ws), math=math)
        if gx is not None:
            algo, math = self._pick(g, d, "forward", None, ws)
            d.forward(self.handle, _ptr(gy), _ptr(w), _ptr(gx), algo, _ptr(ws), _nbytes(ws), math=math)


def fastest_variants(perfs, names) -> dict:
    """{name: (workspace, seconds, math type)} from Find's results: each algorithm once, its fastest
    variant (Find lists one per math type it tried; of equal times the smaller workspace).

    A dict built from Find's list kept each algorithm's last entry - the slowest variant's time
    beside, at run time, the descriptor's own math type, whose workspace may be larger than the
    one planned."""
    best = {}
    for p in sorted(perfs, key=lambda p: (p[2], p[3], p[0], p[6])):
        best.setdefault(names[p[0]], (int(p[3]), float(p[2]), int(p[6])))
    return best


def _pareto_pairs(data: dict, filt: dict) -> list:
    """(name, workspace, seconds) of every data/filter pair no other pair beats in both time and workspace."""
    pairs = sorted(((f"{dn}/{fn}", max(dw, fw), dt + ft) for dn, (dw, dt) in data.items()
                    for fn, (fw, ft) in filt.items()), key=lambda p: (p[2], p[1]))
    front, smallest = [], None
    for p in pairs:
        if smallest is None or p[1] < smallest:
            front.append(p)
            smallest = p[1]
    return front
