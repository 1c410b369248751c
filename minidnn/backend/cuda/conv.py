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

``algo=None`` (a plan that pins defaults) runs the first algorithm of cuDNN's
heuristics whose workspace fits the buffer handed in.

Find's times go to the on-disk algorithm cache the CPU's measurements use
(``minidnn.algo_cache``), keyed by layer, pass, GPU and cuDNN version: every
trainer of the machine then sees the same times and plans the same algorithms
(Find's timing noise would otherwise let two runs of one model pick different
algorithms and differ in the last bits).
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


class CudnnConv:
    """cuDNN convolutions on one handle (bound to the backend's compute stream)."""

    def __init__(self, cudnn, handle, tf32=False, deterministic=True, cache=None, device_name=""):
        """``cache``: an ``algo_cache.AlgoCache`` for Find's times (None: measure every time)."""
        self.cudnn, self.handle = cudnn, handle
        self.tf32, self.deterministic = tf32, deterministic
        self.cache, self.device_name = cache, device_name
        self._descs = {}      # Geom -> cudnn.Conv
        self._found = {}      # (Geom, pass) -> {name: (Algo, seconds)}

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
        """{name: (workspace, seconds)} per half ("forward", "data", "filter"), measured by Find."""
        d, h = self.desc(g), self.handle
        rng = cp.random.default_rng(0)
        x = rng.standard_normal((g.n, g.c, g.h, g.w), dtype=g.dtype)
        w = rng.standard_normal((g.o, g.c // g.groups, g.kh, g.kw), dtype=g.dtype)
        y = rng.standard_normal((g.n, g.o, g.oh, g.ow), dtype=g.dtype)
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
            out[role] = {names[p[0]]: (p[3], p[2]) for p in self._usable(find(h, *map(_ptr, bufs), _ptr(ws), cap))}
            del ws
        cp.cuda.get_current_stream().synchronize()
        return out

    def _cache_key(self, g: Geom, pass_) -> str:
        return json.dumps({"v": 1, "op": "conv2d", "pass": pass_, "backend": "cuda", "device": self.device_name,
                           "cudnn": self.cudnn.version(), "tf32": self.tf32, "deterministic": self.deterministic,
                           "geom": [g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.oh, g.ow, list(g.stride),
                                    list(g.padding), list(g.dilation), g.groups], "dtype": np.dtype(g.dtype).name},
                          sort_keys=True, separators=(",", ":"))

    def _halves(self, g: Geom, pass_):
        """Find's {role: {name: (workspace, seconds)}}, from the cache when it has this layer."""
        key = self._cache_key(g, pass_) if self.cache else None
        hit = self.cache.get(key) if self.cache else None
        roles = ("forward",) if pass_ == "forward" else ("data", "filter")
        if hit:
            d = self.desc(g)
            ws_of = {"forward": (d.forward_workspace, self.cudnn.FWD_ALGOS),
                     "data": (d.backward_data_workspace, self.cudnn.BWD_DATA_ALGOS),
                     "filter": (d.backward_filter_workspace, self.cudnn.BWD_FILTER_ALGOS)}
            out = {r: {} for r in roles}
            for k, t in hit.items():
                role, name = k.split(":", 1)
                fn, names = ws_of.get(role, (None, ()))
                ws = fn(self.handle, names.index(name)) if role in out and name in names else None
                if ws is not None:
                    out[role][name] = (ws, t)
            if all(out[r] for r in roles):
                return out
        out = self._find(g, pass_)
        if self.cache:
            self.cache.put(key, {f"{r}:{n}": t for r in out for n, (_, t) in out[r].items()})
        return out

    def timed(self, g: Geom, pass_) -> dict:
        """{name: (Algo, seconds)} for ``pass_``, fastest first (Find runs once per layer shape and GPU)."""
        key = (g, pass_)
        if key not in self._found:
            halves = self._halves(g, pass_)
            if pass_ == "forward":
                items = [(n, ws, t) for n, (ws, t) in halves["forward"].items()]
            else:
                items = _pareto_pairs(halves["data"], halves["filter"])
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
    def _pick(self, d, role, name, ws):
        names = {"forward": self.cudnn.FWD_ALGOS, "data": self.cudnn.BWD_DATA_ALGOS,
                 "filter": self.cudnn.BWD_FILTER_ALGOS}[role]
        if name is not None:
            if name not in names:
                raise ValueError(f"unknown cuDNN {role} algorithm {name!r} (one of {', '.join(names)}); plans for "
                                 f"the cuda backend name cuDNN's algorithms")
            return names.index(name)
        heur = {"forward": d.forward_heuristics, "data": d.backward_data_heuristics,
                "filter": d.backward_filter_heuristics}[role](self.handle)
        ws_of = {"forward": d.forward_workspace, "data": d.backward_data_workspace,
                 "filter": d.backward_filter_workspace}[role]
        for p in self._usable(heur):
            need = ws_of(self.handle, p[0])
            if need is not None and need <= _nbytes(ws):
                return p[0]
        raise RuntimeError(f"no cuDNN {role} algorithm fits a workspace of {_nbytes(ws)} bytes")

    # -- the passes, with ops.conv_algos' signatures ------------------------
    def forward(self, op, k, x, w, b, y, ws, name):
        g = Geom.of(op, x, w, y)
        d = self.desc(g)
        d.forward(self.handle, _ptr(x), _ptr(w), _ptr(y), self._pick(d, "forward", name, ws), _ptr(ws), _nbytes(ws))
        if b is not None:
            k.conv2d_add_bias(y, b)

    def backward(self, op, k, x, w, gy, gx, gw, gb, ws, name):
        g = Geom.of(op, x if x is not None else gx, w, gy)
        d = self.desc(g)
        dn, fn = name.split("/", 1) if name else (None, None)
        if gb is not None:
            k.conv2d_bias_grad(gy, gb)
        if gw is not None:
            d.backward_filter(self.handle, _ptr(x), _ptr(gy), _ptr(gw), self._pick(d, "filter", fn, ws), _ptr(ws),
                              _nbytes(ws))
        if gx is not None:
            d.backward_data(self.handle, _ptr(w), _ptr(gy), _ptr(gx), self._pick(d, "data", dn, ws), _ptr(ws),
                            _nbytes(ws))

    # ConvTranspose2d: its forward is the backward-data of the convolution from its output to its
    # input, its backward-data that convolution's forward, its filter gradient that one's.
    def transpose_forward(self, op, k, x, w, b, y, ws):
        d = self.desc(self.transposed_geom(op, x, w, y))
        d.backward_data(self.handle, _ptr(w), _ptr(x), _ptr(y), self._pick(d, "data", None, ws), _ptr(ws),
                        _nbytes(ws))
        if b is not None:
            k.conv2d_add_bias(y, b)

    def transpose_backward(self, op, k, x, w, gy, gx, gw, gb, ws):
        d = self.desc(self.transposed_geom(op, x if x is not None else gx, w, gy))
        if gb is not None:
            k.conv2d_bias_grad(gy, gb)
        if gw is not None:
            d.backward_filter(self.handle, _ptr(gy), _ptr(x), _ptr(gw), self._pick(d, "filter", None, ws), _ptr(ws),
                              _nbytes(ws))
        if gx is not None:
            d.forward(self.handle, _ptr(gy), _ptr(w), _ptr(gx), self._pick(d, "forward", None, ws), _ptr(ws),
                      _nbytes(ws))


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
