"""Traces of one training iteration: what ran on each stream, and every byte the executor held.

A :class:`Trace` records one iteration: spans on the compute and copy streams
(kernels, offloads, prefetches, recomputations, stalls), every arena
allocation and free with its tensor, category, size and offset, the copies in
the host store, the plan's predicted memory curve and the executor's measured
peak. Times are seconds from the start of the iteration, on the backend's clock.

One file serves both readers: ``Trace.save`` writes a Chrome Trace Event JSON
(Perfetto, chrome://tracing) whose last keys hold minidnn's own lossless copy
(``"format": "minidnn-trace"``, ``"version"``, ``"minidnn"`` and, from version 2,
``"sha256"``, the digest of that copy), which ``load`` reads back and verifies.
Other exports: a PyTorch memory snapshot (the pickle pytorch.org/memory_viz
opens) and a CSV of the memory curve. ``summary``, ``diff``, ``plot``, ``figure``,
``problems`` and ``from_plan`` (in :mod:`minidnn.trace_plot`, reachable from
here) read, check and predict traces.
"""
from __future__ import annotations

import csv
import gzip
import hashlib
import heapq
import json
import pickle
import time as _time
import zlib
from dataclasses import astuple, dataclass, field, fields

from .atomic_write import replacing
from .errors import MinidnnError
from .schedule import ACT, ACT_GRAD, INPUT, PERSISTENT, WORKSPACE

FORMAT, VERSION = "minidnn-trace", 2      # version 2 adds the "sha256" of the "minidnn" copy
STREAMS = ("compute", "copy", "comm")       # comm: data-parallel reductions, on their own lane
KINDS = ("load", "forward", "backward", "recompute", "accumulate", "update", "offload", "prefetch", "stall",
         "allreduce")
REDUCTION_WAIT = "wait for reduction"       # the name of a stall in which the compute waits for a reduction
HOST_COPY = "host_copy"                       # category of a copy held in the host store
CATEGORIES = PERSISTENT + (INPUT, ACT, ACT_GRAD, WORKSPACE)   # device categories, bottom to top


_CONVERT = {"str": str, "int": int, "float": float}     # field annotations (strings) -> types


class TraceError(MinidnnError, ValueError):
    """A trace file is missing, truncated, or not a minidnn trace; the message names the file."""


@dataclass(slots=True)
class Span:
    """Work on one stream: a step's kernel, a copy, or a stall (the compute stream waiting for a copy)."""

    stream: str          # "compute", "copy" or "comm"
    name: str            # the step's label, e.g. "layer1.0.conv1:conv2d" or "offload relu:relu"
    kind: str            # one of KINDS
    step: int            # index of the program step (-1 if none)
    start: float         # seconds from the start of the iteration
    end: float
    nbytes: int = 0      # bytes moved, for offloads and prefetches


@dataclass(slots=True)
class MemEvent:
    """An allocation or free of one buffer: in the arena, or (category ``host_copy``) in the host store."""

    time: float
    action: str          # "alloc" or "free"
    tensor: str
    category: str        # as in minidnn.schedule ("activation", ...), or "host_copy"
    nbytes: int          # bytes the buffer occupies (aligned, as placed)
    offset: int          # into the arena, or into the host store
    step: int = -1       # program step during which it happened


@dataclass
class Trace:
    """One recorded iteration. Byte figures include the persistent region unless named ``arena``.

    ``persistent``: (name, category, bytes) of every tensor resident the whole
    time (parameters, gradients, optimizer and BN state). ``planned``: (program
    step, device bytes live at that step by the plan, persistent included).
    ``measured_peak``: persistent + the executor's own arena high-water mark.
    A step that runs as several plans (k sub-batches, then the update) is one
    trace whose program steps follow each other (:class:`SplitRecording`);
    ``parts`` names each plan's run and its steps.
    """

    device: str = "cpu"
    budget: int | None = None
    persistent: list = field(default_factory=list)
    spans: list = field(default_factory=list)
    mem_events: list = field(default_factory=list)
    planned: list = field(default_factory=list)
    plan_peak: int = 0
    measured_peak: int = 0
    host_bytes: int = 0
    iteration: int = 0
    meta: dict = field(default_factory=dict)     # free-form: model, batch, policy, backend clock...
    predicted_seconds: float | None = None       # the plan's prediction of the whole step (None: not known)
    unlimited_seconds: float | None = None       # the whole step, unsplit, with unlimited memory (None: not known)
    parts: list = field(default_factory=list)    # a step run as several plans: (name, first step, last step)

    @property
    def persistent_bytes(self) -> int:
        return sum(n for _, _, n in self.persistent)

    @property
    def duration(self) -> float:
        ends = [s.end for s in self.spans] + [e.time for e in self.mem_events]
        return max(ends, default=0.0)

    def categories(self) -> list:
        """Device categories present, persistent first (the stacking order of every plot)."""
        seen = {c for _, c, _ in self.persistent} | {e.category for e in self.mem_events}
        seen.discard(HOST_COPY)
        return [c for c in CATEGORIES if c in seen] + sorted(seen - set(CATEGORIES))

    # -- the lossless form ------------------------------------------------------
    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["persistent"] = [list(p) for p in self.persistent]
        d["planned"] = [list(p) for p in self.planned]
        d["parts"] = [list(p) for p in self.parts]
        d["spans"] = [list(astuple(s)) for s in self.spans]
        d["mem_events"] = [list(astuple(e)) for e in self.mem_events]
        d["columns"] = {"spans": [f.name for f in fields(Span)], "mem_events": [f.name for f in fields(MemEvent)]}
        return d

    @classmethod
    def from_dict(cls, d: dict, where="trace") -> Trace:
        missing = [k for k in ("spans", "mem_events", "measured_peak") if k not in d]
        if missing:
            raise TraceError(f"{where}: malformed minidnn trace: missing field {missing[0]!r}")
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        item = "persistent"
        try:
            kw["persistent"] = [(str(n), str(c), int(b)) for n, c, b in d.get("persistent", [])]
            item = "planned"
            kw["planned"] = [(int(i), int(b)) for i, b in d.get("planned", [])]
            item = "parts"
            kw["parts"] = [(str(n), int(a), int(b)) for n, a, b in d.get("parts", [])]
            for item, typ in (("spans", Span), ("mem_events", MemEvent)):
                conv = [_CONVERT[f.type] for f in fields(typ)]
                kw[item] = [typ(*(c(v) for c, v in zip(conv, row))) if len(row) <= len(conv) else typ(*row)
                            for row in d[item]]
        except (TypeError, ValueError, OverflowError) as e:     # OverflowError: an integer given as Infinity
            raise TraceError(f"{where}: malformed minidnn trace: bad entry in {item!r} ({e})") from None
        return cls(**kw)

    def save(self, path) -> None:
        """Write the trace: Chrome Trace Event JSON (gzip if ``path`` ends in .gz) that ``load`` reads back.
        Whole or not at all: a write that fails (a full disk) leaves ``path`` as it was."""
        doc = to_chrome(self)
        # Perfetto stops reading at the first top-level key it does not know: ours come last.
        own = self.to_dict()
        doc.update({"format": FORMAT, "version": VERSION, "minidnn": own, "sha256": _digest(own)})
        opener = gzip.open if str(path).endswith(".gz") else open
        with replacing(path) as tmp, opener(tmp, "wt", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))

    def save_memory_snapshot(self, path) -> None:
        """Write the PyTorch memory snapshot pickle (protocol 4) for pytorch.org/memory_viz."""
        with open(path, "wb") as f:
            pickle.dump(to_memory_snapshot(self), f, protocol=4)


def load(path) -> Trace:
    """Read a trace written by ``Trace.save``; anything else raises :class:`TraceError` naming ``path``."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise TraceError(f"{path}: cannot read trace file ({e.strerror or e})") from None
    try:
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:     # a damaged deflate stream is a zlib.error
        raise TraceError(f"{path}: truncated or corrupt gzip trace ({e})") from None
    if raw[:1] == b"\x80" and raw[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        raise TraceError(f"{path}: not a minidnn trace but a pickle (a memory snapshot? open it in "
                         f"pytorch.org/memory_viz)")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a minidnn trace (binary data, not JSON)") from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: truncated or malformed trace file: invalid JSON at line {e.lineno} "
                         f"column {e.colno} ({e.msg})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        chrome = isinstance(doc, list) or (isinstance(doc, dict) and "traceEvents" in doc)
        what = "a Chrome trace minidnn did not write" if chrome else "foreign JSON"
        raise TraceError(f"{path}: not a minidnn trace ({what}: no \"format\": \"{FORMAT}\" key)")
    if not isinstance(doc.get("version"), int) or doc["version"] > VERSION:
        raise TraceError(f"{path}: minidnn trace version {doc.get('version')!r} is not supported "
                         f"(this minidnn reads up to {VERSION})")
    if not isinstance(doc.get("minidnn"), dict):
        raise TraceError(f"{path}: malformed minidnn trace: missing field 'minidnn'")
    trace = Trace.from_dict(doc["minidnn"], where=str(path))
    try:
        memory_curve(trace)                 # every free matches an allocation: the readers can rely on it
    except TraceError as e:
        raise TraceError(f"{path}: inconsistent minidnn trace: {str(e).removeprefix('trace: ')}") from None
    if doc["version"] >= 2 and doc.get("sha256") != _digest(doc["minidnn"]):    # after the checks that say more
        what = "has no 'sha256' checksum" if "sha256" not in doc else "does not match its checksum"
        raise TraceError(f"{path}: corrupt minidnn trace: its content {what}")
    return trace


def _digest(own) -> str:
    """SHA-256 of the lossless copy in one canonical JSON form (floats print as they read back)."""
    text = json.dumps(own, separators=(",", ":"), sort_keys=True, allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


class Recorder:
    """What the executor calls while it runs: appends of plain tuples; the :class:`Trace` is built later.

    Memory is bounded: only one iteration in ``every`` is recorded, and only the
    one being recorded and the last finished one are held. ``clock`` is the
    backend's clock (seconds). Spans and events may come from the copy stream's thread.
    """

    def __init__(self, every=1, clock=_time.perf_counter):
        self.every, self.clock = max(1, int(every)), clock
        self.t0, self.spans, self.events = 0.0, [], []
        self._last, self._trace = None, None

    def begin(self, iteration) -> bool:
        """Start iteration ``iteration``; False when it is not sampled (then record nothing)."""
        if iteration % self.every:
            return False
        self.spans, self.events = [], []
        self.t0 = self.clock()
        return True

    def span(self, stream, name, kind, step, start, end, nbytes=0):
        self.spans.append((stream, name, kind, step, start, end, nbytes))

    def mem(self, time, action, tensor, category, nbytes, offset, step=-1):
        self.events.append((time, action, tensor, category, nbytes, offset, step))

    def end(self, **fields) -> None:
        """Close the iteration (constant time); ``fields`` are Trace's others (device, budget, persistent...)."""
        self._last, self._trace = (self.t0, self.spans, self.events, fields), None
        self.spans, self.events = [], []

    @property
    def trace(self) -> Trace | None:
        """The Trace of the last closed iteration, built on first use."""
        if self._trace is None and self._last is not None:
            t0, spans, events, fields = self._last
            spans = sorted((Span(a, b, c, d, s - t0, e - t0, n) for a, b, c, d, s, e, n in spans),
                           key=lambda s: (s.start, -s.end))
            events = sorted((MemEvent(t - t0, *rest) for t, *rest in events), key=lambda e: e.time)
            self._trace = Trace(spans=spans, mem_events=events, **fields)
        return self._trace

    def finish(self, **fields) -> Trace:
        """``end`` and ``trace`` in one."""
        self.end(**fields)
        return self.trace


class SplitRecording:
    """One step that runs as several plans (k sub-batches, then the update), recorded as one iteration.

    ``part`` gives the recorder to hand the executor for each run in turn; the
    runs' program steps follow each other in the trace (a part's step i is the
    trace's ``first + i``), and ``end`` closes the iteration with the runs'
    figures merged: persistent tensors by name, the planned curves end to end,
    the highest measured peak, and the step's own plan peak and predictions.
    Nothing is recorded when ``recorder`` is None or does not sample ``iteration``.
    """

    def __init__(self, recorder, iteration):
        self.recorder, self.iteration = recorder, iteration
        self.active = recorder is not None and recorder.begin(iteration)
        self.parts, self.closed, self.first = [], [], 0
        self.unstepped = set()           # spans of no program step recorded so far (see _Part.span)

    def part(self, name, steps):
        """The recorder of the next run, of ``steps`` program steps (None when nothing is recorded)."""
        if not self.active:
            return None
        part = _Part(self, self.first)
        self.parts.append((name, self.first, self.first + steps - 1))
        self.first += steps
        return part

    def end(self, plan_peak, budget, predicted_seconds=None, unlimited_seconds=None) -> None:
        """Close the iteration; ``plan_peak``, ``budget`` and the predicted seconds are the whole step's."""
        if not self.active:
            return
        persistent, planned = {}, []
        for first, run in self.closed:
            for name, category, nbytes in run["persistent"]:
                persistent.setdefault(name, (name, category, nbytes))
            planned += [(first + i, n) for i, n in run["planned"]]
        self.recorder.end(device=self.closed[0][1]["device"], budget=budget, persistent=list(persistent.values()),
                          planned=planned, plan_peak=plan_peak,
                          measured_peak=max(f["measured_peak"] for _, f in self.closed),
                          host_bytes=max(f["host_bytes"] for _, f in self.closed), iteration=self.iteration,
                          predicted_seconds=predicted_seconds, unlimited_seconds=unlimited_seconds,
                          parts=list(self.parts))


class _Part:
    """The recorder the executor gets for one run of a :class:`SplitRecording`: its steps shifted by
    ``first``, its closing figures kept for the whole step's."""

    def __init__(self, whole, first):
        self.whole, self.first = whole, first
        self.clock = whole.recorder.clock

    def begin(self, iteration) -> bool:
        return True                      # the whole step's iteration is begun, and sampled

    def span(self, stream, name, kind, step, start, end, nbytes=0):
        if step < 0:
            # spans of no program step (a data-parallel step's collectives) are recorded by every run
            # that waits for them: the same span, the same times, recorded once
            key = (stream, name, kind, start, end, nbytes)
            if key in self.whole.unstepped:
                return
            self.whole.unstepped.add(key)
        self.whole.recorder.span(stream, name, kind, step + self.first if step >= 0 else step, start, end, nbytes)

    def mem(self, time, action, tensor, category, nbytes, offset, step=-1):
        self.whole.recorder.mem(time, action, tensor, category, nbytes, offset,
                                step + self.first if step >= 0 else step)

    def end(self, **fields) -> None:
        self.whole.closed.append((self.first, fields))


# -- replaying the memory events ---------------------------------------------------------------

def memory_curve(trace):
    """The memory after each event: (categories, rows), one row per event after a first row at time 0.

    A row is (time, event or None, device bytes live, footprint, host-store
    bytes, [bytes per category]); the footprint is persistent + the top of the
    live arena buffers, whose maximum is the executor's high-water account.
    """
    cats = trace.categories()
    col = {c: i for i, c in enumerate(cats)}
    by = [0] * len(cats)
    for _, c, n in trace.persistent:
        by[col[c]] += n
    base = trace.persistent_bytes
    live, tops, host = {}, [], 0            # live: key -> allocating event; tops: heap of (-end, id, key)
    rows = [(0.0, None, sum(by), base, 0, list(by))]
    for e in trace.mem_events:
        key = (e.category == HOST_COPY, e.tensor, e.offset)
        if e.action == "alloc":
            if key in live:
                raise TraceError(f"trace: {e.tensor} allocated twice at offset {e.offset} (t={e.time:.6f}s)")
            live[key], n = e, e.nbytes
            if e.category != HOST_COPY:
                heapq.heappush(tops, (-(e.offset + e.nbytes), id(e), key))
        elif e.action == "free":
            if key not in live:
                raise TraceError(f"trace: {e.tensor} freed at offset {e.offset} but never allocated "
                                 f"(t={e.time:.6f}s)")
            n = -live.pop(key).nbytes
        else:
            raise TraceError(f"trace: unknown memory action {e.action!r} for {e.tensor}")
        if e.category == HOST_COPY:
            host += n
        else:
            by[col[e.category]] += n
        while tops and id(live.get(tops[0][2])) != tops[0][1]:     # drop freed buffers from the top
            heapq.heappop(tops)
        rows.append((e.time, e, sum(by), base - tops[0][0] if tops else base, host, list(by)))
    return cats, rows


def step_times(trace) -> dict:
    """program step -> (start, end) of its work on the compute stream (where the plan's curve is placed)."""
    out = {}
    for s in trace.spans:
        if s.step >= 0 and s.stream == "compute" and s.kind != "stall":
            a, b = out.get(s.step, (s.start, s.end))
            out[s.step] = (min(a, s.start), max(b, s.end))
    return out


# -- exports ---------------------------------------------------------------------------------

_PID, _HOST_PID, _TID = 1, 2, {"compute": 1, "copy": 2, "comm": 3}


def _us(t) -> float:
    return round(t * 1e9) / 1000      # microseconds, on a nanosecond grid (what Perfetto keeps)


def to_chrome(trace) -> dict:
    """Chrome Trace Event JSON: a process for the device (a thread per stream) and one for the host store."""
    ev = [{"name": "process_name", "ph": "M", "pid": _PID, "args": {"name": f"minidnn {trace.device} device"}},
          {"name": "process_sort_index", "ph": "M", "pid": _PID, "args": {"sort_index": 0}},
          {"name": "process_name", "ph": "M", "pid": _HOST_PID, "args": {"name": "host store"}},
          {"name": "process_sort_index", "ph": "M", "pid": _HOST_PID, "args": {"sort_index": 1}}]
    used = {s.stream for s in trace.spans}
    for stream, tid in _TID.items():
        if stream == "comm" and stream not in used:     # a lane for reductions only where there are some
            continue
        ev.append({"name": "thread_name", "ph": "M", "pid": _PID, "tid": tid, "args": {"name": f"{stream} stream"}})
        ev.append({"name": "thread_sort_index", "ph": "M", "pid": _PID, "tid": tid, "args": {"sort_index": tid}})
    for s in trace.spans:
        a, b = round(s.start * 1e9), round(s.end * 1e9)
        e = {"name": s.name, "cat": s.kind, "ph": "X", "ts": a / 1000, "dur": (b - a) / 1000, "pid": _PID,
             "tid": _TID.get(s.stream, 3), "args": {"step": s.step, "kind": s.kind}}
        if s.nbytes:
            e["args"]["bytes"] = s.nbytes
        if s.kind == "stall":
            e["cname"] = "terrible"     # red in chrome://tracing
        ev.append(e)
    cats, rows = memory_curve(trace)
    for t, e, total, top, host, by in rows:
        ts = _us(t)
        ev.append({"name": "device memory by category", "ph": "C", "ts": ts, "pid": _PID, "args": dict(zip(cats, by))})
        ev.append({"name": "device bytes (measured)", "ph": "C", "ts": ts, "pid": _PID, "args": {"bytes": total}})
        ev.append({"name": "device footprint (persistent + arena top)", "ph": "C", "ts": ts, "pid": _PID,
                   "args": {"bytes": top}})
        if e is None or e.category == HOST_COPY:
            ev.append({"name": "host store bytes", "ph": "C", "ts": ts, "pid": _HOST_PID, "args": {"bytes": host}})
    times = step_times(trace)
    for step, n in trace.planned:
        if step in times:
            ev.append({"name": "device bytes (planned)", "ph": "C", "ts": _us(times[step][0]), "pid": _PID,
                       "args": {"bytes": n}})
    if trace.budget is not None:
        for t in (0.0, trace.duration):
            ev.append({"name": "budget", "ph": "C", "ts": _us(t), "pid": _PID, "args": {"bytes": trace.budget}})
    other = {"device": trace.device, "iteration": trace.iteration, "budget": trace.budget,
             "plan_peak": trace.plan_peak, "measured_peak": trace.measured_peak,
             "predicted_seconds": trace.predicted_seconds, "unlimited_seconds": trace.unlimited_seconds,
             "runs": [{"name": n, "steps": [a, b]} for n, a, b in trace.parts]}
    return {"displayTimeUnit": "ms", "traceEvents": ev, "otherData": other}


_BASE = 0x7F0000000000         # made-up device addresses: the persistent region, then the arena
_HOST_BASE = 0x7E0000000000
_SEGMENT_ALIGN = 2 << 20


def _segment(device, address, size, live):
    """A snapshot segment of ``size`` bytes whose active blocks are ``live`` {(offset, size): frames}."""
    blocks, at = [], 0
    for (off, n), frames in sorted(live.items()):
        if off > at:
            blocks.append({"size": off - at, "state": "inactive"})
        blocks.append({"size": n, "requested_size": n, "state": "active_allocated", "frames": frames})
        at = off + n
    if at < size:
        blocks.append({"size": size - at, "state": "inactive"})
    used = sum(b["size"] for b in blocks if b["state"] != "inactive")
    return {"device": device, "address": address, "total_size": size, "allocated_size": used,
            "active_size": used, "requested_size": used, "stream": 0, "segment_type": "large",
            "is_expandable": False, "frames": [], "blocks": blocks}


def to_memory_snapshot(trace) -> dict:
    """The memory history as ``torch.cuda.memory._snapshot()`` lays it out: the device is device 0, its only one.

    Each buffer's frame reads ``category:step:tensor`` and its event carries the
    category, so memory_viz colours by category. Persistent tensors are
    allocated at time 0 in their own segment; the arena is a second segment.
    The host store is host memory, not a device: its copies are under the key
    ``"host_store"`` (its size, its trace of the same form, and the blocks live
    at the end), which memory_viz does not read.
    """
    def frames(e_name, cat, step):
        return [{"filename": cat, "line": max(int(step), 0), "name": e_name}]

    traces, live = [[], []], [{}, {}]
    at = 0
    for name, cat, n in trace.persistent:
        if n:
            fr = frames(name, cat, 0)
            traces[0].append({"action": "alloc", "addr": _BASE + at, "size": n, "stream": 0, "frames": fr,
                              "category": cat, "time_us": 0})
            live[0][(at, n)] = fr
            at += n
    pers = at
    arena_off = -(-pers // _SEGMENT_ALIGN) * _SEGMENT_ALIGN
    arena_base = _BASE + arena_off
    top = [0, trace.host_bytes]
    for e in trace.mem_events:
        dev = int(e.category == HOST_COPY)
        off = e.offset + (0 if dev else arena_off)
        addr = (_HOST_BASE if dev else _BASE) + off
        fr = frames(e.tensor, e.category, e.step)
        t_us = int(e.time * 1e6)
        if e.action == "alloc":
            traces[dev].append({"action": "alloc", "addr": addr, "size": e.nbytes, "stream": 0, "frames": fr,
                                "category": e.category, "time_us": t_us})
            live[dev][(off, e.nbytes)] = fr
            top[dev] = max(top[dev], e.offset + e.nbytes)
        else:
            for action in ("free_requested", "free_completed"):
                traces[dev].append({"action": action, "addr": addr, "size": e.nbytes, "stream": 0, "frames": fr,
                                    "category": e.category, "time_us": t_us})
            live[dev].pop((off, e.nbytes), None)
    # memory_viz adds an "unknown" category to any snapshot with categories (some versions by a
    # misspelt name, which fails): a closing "snapshot" entry brings its own.
    traces[0].append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "frames": [],
                      "category": "unknown", "time_us": int(trace.duration * 1e6)})
    segments = []
    if pers:
        segments.append(_segment(0, _BASE, pers, {k: v for k, v in live[0].items() if k[0] < pers}))
    if top[0]:
        segments.append(_segment(0, arena_base, top[0],
                                 {(o - arena_off, n): v for (o, n), v in live[0].items() if o >= arena_off}))
    host = _segment(None, _HOST_BASE, top[1], live[1])
    host_store = {"total_size": top[1], "address": _HOST_BASE, "blocks": host["blocks"], "trace": traces[1]}
    return {"segments": segments, "device_traces": traces[:1], "allocator_settings": {}, "host_store": host_store}


def to_csv(trace, path) -> None:
    """The memory curve as CSV: one row per memory event (after it), bytes per category, planned where known."""
    cats, rows = memory_curve(trace)
    planned = dict(trace.planned)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time_s", "step", "action", "tensor", "category", "nbytes", "offset", "device_bytes",
                    "footprint_bytes", "host_store_bytes", "planned_bytes"] + [f"{c}_bytes" for c in cats])
        for t, e, total, top, host, by in rows:
            head = ([f"{t:.9f}", e.step, e.action, e.tensor, e.category, e.nbytes, e.offset] if e is not None
                    else [f"{t:.9f}", "", "start", "", "", "", ""])
            plan = planned.get(e.step, "") if e is not None else ""
            w.writerow(head + [total, top, host, plan] + by)


def __getattr__(name):
    # summary, diff, plot, figure, stats, problems and from_plan live in minidnn.trace_plot, loaded on first use
    if name in ("summary", "diff", "plot", "figure", "stats", "problems", "from_plan"):
        from . import trace_plot
        return getattr(trace_plot, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
