"""Measured speed of convolution algorithms, cached on disk (cuDNN's Find, for every backend).

:func:`profile_conv` times each algorithm a layer offers, once per (layer
shape, pass, dtype, backend, CPU), on random data in freshly allocated buffers,
and keeps the fastest of a few runs (other load only ever adds time, so a
median measured on a busy machine would be cached as the algorithm's speed for
good) in a JSON file shared by every process of the machine:
``$MINIDNN_CACHE_DIR/algos.json``, else ``~/.cache/minidnn/algos.json``.

Writers merge their entries into the file's current content under an
exclusive lock (``fcntl.flock`` on a side file) and replace it atomically
(temporary file + ``os.replace``), so concurrent writers lose nothing and
readers never see a partial file. A file that is not valid JSON is ignored
with a warning naming it (and overwritten by the next write).
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
import time
import types
import warnings

import numpy as np

try:
    import fcntl
except ImportError:          # Windows: atomic replace only, no lock
    fcntl = None

FLUSH_BYTES = 64 << 20   # streamed (two float32 halves added) before each timed run: more than a last-level cache
VERSION = 5   # bump when the algorithms or the timing rule change enough to invalidate old timings


def default_path() -> str:
    d = os.environ.get("MINIDNN_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "minidnn")
    return os.path.join(d, "algos.json")


def cpu_id() -> str:
    """Machine, CPU model and core count: timings move between identical machines only."""
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{platform.machine()}/{model}/{os.cpu_count()} cores"


class AlgoCache:
    """A JSON file of {key: {algorithm name: seconds}}."""

    def __init__(self, path=None):
        self.path = os.fspath(path) if path is not None else default_path()

    def key(self, op, in_specs, out_specs, pass_, backend_name, threads=None) -> str:
        """The cache key of one layer's pass: op, attributes, shapes, dtype, backend, CPU."""
        attrs = {}
        for a in ("stride", "padding", "dilation", "groups", "output_padding"):
            v = getattr(op, a, None)
            if v is not None:
                attrs[a] = list(v) if isinstance(v, tuple) else v
        return json.dumps({"v": VERSION, "op": op.name, "pass": pass_, "attrs": attrs,
                           "in": [list(s.shape) for s in in_specs], "out": [list(s.shape) for s in out_specs],
                           "dtype": np.dtype(in_specs[0].dtype).name, "backend": backend_name,
                           "cpu": cpu_id(), "threads": threads}, sort_keys=True, separators=(",", ":"))

    def get(self, key):
        """The cached {algorithm: seconds} of ``key``, or None."""
        v = self._read().get(key)
        return dict(v) if isinstance(v, dict) else None

    def put(self, key, timings: dict):
        """Merge ``timings`` into the entry of ``key`` (other keys and entries are kept)."""
        d = os.path.dirname(self.path) or "."
        os.makedirs(d, exist_ok=True)
        with self._locked():
            data = self._read()
            entry = data.get(key) if isinstance(data.get(key), dict) else {}
            entry.update({str(k): float(v) for k, v in timings.items()})
            data[key] = entry
            fd, tmp = tempfile.mkstemp(dir=d, prefix=".algos-", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=0, sort_keys=True)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise

    def _read(self) -> dict:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict):
                raise ValueError(f"expected a JSON object, got {type(data).__name__}")
            return data
        except FileNotFoundError:
            return {}
        except (ValueError, UnicodeDecodeError) as e:
            warnings.warn(f"minidnn: ignoring the corrupt algorithm cache {self.path} ({e})", stacklevel=3)
            return {}

    @contextlib.contextmanager
    def _locked(self):
        if fcntl is None:
            yield
            return
        with open(self.path + ".lock", "a+") as lf:
            fcntl.flock(lf.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lf.fileno(), fcntl.LOCK_UN)


# ---------------------------------------------------------------- profiling
def _best_time(fn, repeats, before=None):
    """The fastest of ``repeats`` runs of ``fn`` after a warm-up, each right after ``before()``."""
    fn()                                   # warm-up: page faults, BLAS buffers
    ts = []
    for _ in range(max(1, repeats)):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def _buffers(specs, rng):
    return [rng.standard_normal(s.shape).astype(s.dtype) for s in specs]


def measure(op, in_specs, out_specs, pass_, backend, names=None, repeats=3) -> dict:
    """{algorithm: seconds, the fastest of ``repeats`` runs} of ``op``'s pass, measured now (no cache).

    A Conv2d backward pair "data/filter" is timed as the sum of its halves
    (each half run alone, the other gradient not requested); a pair of one
    family ("im2col", "direct", ...) is timed whole, as it runs.
    """
    from .ops import conv_algos
    from .ops.conv import Conv2dOp

    algos = {a.name: a for a in backend.conv.algorithms(op, in_specs, out_specs, pass_)}
    names = list(algos) if names is None else list(names)
    rng = np.random.default_rng(0)
    ins, outs = _buffers(in_specs, rng), [np.empty(s.shape, s.dtype) for s in out_specs]
    k = backend.k
    flush = [np.zeros(FLUSH_BYTES // 2 // 4, np.float32) for _ in range(2)]

    def as_in_a_network():     # the layer before: an elementwise kernel that streams past the caches
        k.add_inplace(*flush)

    def run(name, gins=None):
        ws = backend.empty(algos[name].workspace)
        ctx = types.SimpleNamespace(k=k, rng=rng, recompute=False, algo=name, xp=np, conv=backend.conv)
        if pass_ == "forward":
            return _best_time(lambda: op.forward(ctx, ins, outs, ws), repeats, as_in_a_network)
        return _best_time(lambda: op.backward(ctx, ins, outs, gouts, gins, ws), repeats, as_in_a_network)

    if pass_ == "forward":
        return {n: run(n) for n in names}
    gouts = _buffers(out_specs, rng)
    gall = [np.empty(s.shape, s.dtype) for s in in_specs]
    if not isinstance(op, Conv2dOp):
        return {n: run(n, gall) for n in names}
    out, halves = {}, {}
    none = [None] * len(in_specs)
    for n in names:
        if "/" not in n:
            out[n] = run(n, gall)
            continue
        d, f = conv_algos.split(n, "backward")
        if ("data", d) not in halves:
            halves["data", d] = run(n, [gall[0]] + none[1:])
        if ("filter", f) not in halves:
            halves["filter", f] = run(n, [None] + gall[1:])
        out[n] = halves["data", d] + halves["filter", f]
    return out


def profile_conv(op, in_specs, out_specs, pass_, backend, repeats=3, cache=None) -> dict:
    """{algorithm: seconds} for every algorithm of ``op``'s ``pass_``, from the
    cache when it has them all, else measured (see :func:`measure`) and cached.

    ``cache``: an :class:`AlgoCache`, None for the default one, False for none.
    """
    if cache is None:
        cache = AlgoCache()
    names = [a.name for a in backend.conv.algorithms(op, in_specs, out_specs, pass_)]
    threads = backend.k.get_num_threads() if hasattr(backend.k, "get_num_threads") else None
    key = cache.key(op, in_specs, out_specs, pass_, backend.name, threads) if cache else None
    hit = cache.get(key) if cache else None
    if hit is not None and all(n in hit for n in names):
        return {n: hit[n] for n in names}
    timings = measure(op, in_specs, out_specs, pass_, backend, names, repeats)
    if cache:
        cache.put(key, timings)
    return timings
