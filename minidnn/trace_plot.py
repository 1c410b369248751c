"""Reading a trace: its figures (``stats``), a ``summary``, a ``diff`` of two, a ``plot`` (of a
``figure``), its ``problems`` (consistency checks), and ``from_plan``, the trace a plan predicts
(to diff a run against its plan).

Everything here is also reachable as ``minidnn.trace.<name>``; matplotlib is
imported only by ``figure``.
"""
from __future__ import annotations

import bisect
from collections import Counter, defaultdict

from .memory.config import format_bytes as fb
from .schedule import aligned
from .trace import (HOST_COPY, KINDS, REDUCTION_WAIT, STREAMS, MemEvent, Span,
                    Trace, TraceError, memory_curve, step_times)

COLORS = {"parameter": "#4e79a7", "gradient": "#a0cbe8", "optimizer_state": "#59a14f", "bn_state": "#8cd17d",
          "input": "#b6992d", "activation": "#f28e2b", "activation_gradient": "#ffbe7d", "workspace": "#bab0ac",
          "forward": "#4e79a7", "backward": "#59a14f", "recompute": "#f28e2b", "update": "#79706e",
          "accumulate": "#bab0ac", "load": "#d4a6c8", "offload": "#b07aa1", "prefetch": "#17becf",
          "stall": "#e15759", "allreduce": "#9c755f"}


def _measure(intervals) -> float:
    """Length of the union of (start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def _overlap(a, b) -> float:
    """Length of (union of a) intersected with (union of b)."""
    return _measure(a) + _measure(b) - _measure(list(a) + list(b))


def live_at(trace, index) -> list:
    """The device buffers (the MemEvents that allocated them) live after memory event ``index``."""
    live = {}
    for e in trace.mem_events[:index + 1]:
        if e.category != HOST_COPY:
            if e.action == "alloc":
                live[(e.tensor, e.offset)] = e
            else:
                live.pop((e.tensor, e.offset), None)
    return list(live.values())


def problems(trace) -> list:
    """What is inconsistent in a trace (empty when it is sound): streams, kinds, span nesting, accounting."""
    out = []
    for stream in {s.stream for s in trace.spans}:
        if stream not in STREAMS:
            out.append(f"unknown stream {stream!r}")
        stack = []
        for s in sorted((s for s in trace.spans if s.stream == stream), key=lambda s: (s.start, -s.end)):
            if s.end < s.start:
                out.append(f"{stream}: span {s.name} ends before it starts")
            while stack and stack[-1].end <= s.start:
                stack.pop()
            if stack and s.end > stack[-1].end:
                out.append(f"{stream}: {s.name} [{s.start:.6f}, {s.end:.6f}] partially overlaps "
                           f"{stack[-1].name} [{stack[-1].start:.6f}, {stack[-1].end:.6f}]")
            stack.append(s)
    out += [f"unknown span kind {k!r}" for k in sorted({s.kind for s in trace.spans} - set(KINDS))]
    if any(b.time < a.time for a, b in zip(trace.mem_events, trace.mem_events[1:])):
        out.append("memory events are not in time order")
    try:
        _, rows = memory_curve(trace)
    except TraceError as e:
        return out + [str(e).removeprefix("trace: ")]
    if any(min(r[5], default=0) < 0 or r[4] < 0 for r in rows):
        out.append("a category's bytes go negative")
    peak = max(r[3] for r in rows)
    if peak != trace.measured_peak:
        out.append(f"the events' high-water mark {peak} B differs from the executor's measured peak "
                   f"{trace.measured_peak} B")
    return out


def part_of(trace, step) -> int:
    """Index into ``trace.parts`` of the run that program step ``step`` belongs to (0 for a one-run trace)."""
    return max(bisect.bisect_right([first for _, first, _ in trace.parts], step) - 1, 0)


def _span_at(trace, row):
    """The work going on at memory-curve row ``row``: its event's step's span (a kernel, or a copy), else
    the compute span running at its time; None if neither."""
    t, ev = row[0], row[1]
    at = [s for s in trace.spans if s.step == ev.step and s.kind != "stall"] if ev is not None else []
    at = at or [s for s in trace.spans if s.stream == "compute" and s.start <= t <= s.end]
    return min(at, key=lambda s: (s.stream != "compute", s.start)) if at else None


def stats(trace) -> dict:
    """The figures ``summary`` and ``diff`` report, by name (bytes, seconds, counts, ratios).

    ``peak_bytes`` is the footprint's high-water mark (persistent + the top of
    the live arena buffers: the executor's own account, and the plan's peak);
    the peak's place (``peak_time``, ``peak_step``, ``peak_span``,
    ``peak_by_category``, ``peak_tensors``) is the first moment the most bytes
    are live (``peak_live_bytes``), which is where a plan puts its peak.
    """
    cats, rows = memory_curve(trace)
    j = max(range(len(rows)), key=lambda i: rows[i][2])       # first time the most bytes are live
    t_peak = rows[j][0]
    peak_step = rows[j][1].step if rows[j][1] is not None else -1
    planned_most = max(trace.planned, key=lambda p: p[1]) if trace.planned else None     # first such step
    by_kind = defaultdict(float)
    for s in trace.spans:
        by_kind[s.kind] += s.end - s.start
    compute = [(s.start, s.end) for s in trace.spans if s.stream == "compute" and s.kind != "stall"]
    copies = [(s.start, s.end) for s in trace.spans if s.stream == "copy"]
    fwd = [(s.start, s.end) for s in trace.spans if s.kind == "forward"]
    bwd = {}                           # run -> (start, end) of its backward: each sub-batch has its own
    for s in trace.spans:
        if s.kind == "backward":
            p = part_of(trace, s.step)
            a, b = bwd.get(p, (s.start, s.end))
            bwd[p] = (min(a, s.start), max(b, s.end))

    def in_backward(span):
        a, b = bwd.get(part_of(trace, span.step), (1.0, 0.0))       # a run with no backward has nothing in it
        return a <= span.start <= b

    offl = [s for s in trace.spans if s.kind == "offload"]
    pref = [s for s in trace.spans if s.kind == "prefetch"]
    copy_busy = _measure(copies)
    measured, planned = {}, dict(trace.planned)
    for t, e, total, *_ in rows[1:]:
        if e.step < 0 or e.category == HOST_COPY:
            continue
        if e.action == "alloc":
            measured[e.step] = total
        elif e.step not in measured:               # a step that only frees: what it held before
            measured[e.step] = total + e.nbytes
    gaps = {s: measured[s] - planned[s] for s in measured if s in planned and measured[s] != planned[s]}
    return {
        "seconds": trace.duration, "steps": len({s.step for s in trace.spans if s.step >= 0}),
        "peak_bytes": max(r[3] for r in rows), "peak_time": t_peak, "peak_step": peak_step,
        "peak_span": _span_at(trace, rows[j]),
        "peak_part": trace.parts[part_of(trace, peak_step)][0] if trace.parts and peak_step >= 0 else None,
        "peak_live_bytes": rows[j][2], "peak_by_category": dict(zip(cats, rows[j][5])),
        "peak_tensors": sorted(live_at(trace, j - 1) if j else [], key=lambda e: -e.nbytes),
        "planned_peak_step": planned_most[0] if planned_most else None,
        "planned_peak_live_bytes": planned_most[1] if planned_most else None,
        "measured_peak": trace.measured_peak, "plan_peak": trace.plan_peak, "budget": trace.budget,
        "budget_crossed": trace.budget is not None and max(r[3] for r in rows) > trace.budget,
        "offload_bytes": sum(s.nbytes for s in offl), "offloads": len(offl),
        "prefetch_bytes": sum(s.nbytes for s in pref), "prefetches": len(pref),
        "offloads_overlapping_forward": sum(_overlap([(s.start, s.end)], fwd) > 0 for s in offl),
        "prefetches_in_backward": sum(in_backward(s) for s in pref),
        "copy_seconds": copy_busy, "overlap": _overlap(copies, compute) / copy_busy if copy_busy else 1.0,
        "stall_seconds": by_kind["stall"], "stalls": sum(s.kind == "stall" for s in trace.spans),
        "comm_seconds": by_kind["allreduce"], "reductions": sum(s.kind == "allreduce" for s in trace.spans),
        "exposed_comm_seconds": sum(s.end - s.start for s in trace.spans
                                    if s.kind == "stall" and s.name.startswith(REDUCTION_WAIT)),
        "recompute_seconds": by_kind["recompute"], "recomputes": sum(s.kind == "recompute" for s in trace.spans),
        "seconds_by_kind": dict(by_kind), "host_peak_bytes": max(r[4] for r in rows), "host_bytes": trace.host_bytes,
        "plan_steps_compared": len([s for s in measured if s in planned]), "plan_gaps": gaps,
        "unfreed": live_at(trace, len(trace.mem_events) - 1),
        "steps_without_spans": sorted(set(planned) - {s.step for s in trace.spans}),
    }


def _ms(t) -> str:
    return f"{t * 1e3:.2f} ms"


def _pct(v) -> str:
    return f"{v * 100:.1f}%"


def _agreement(trace, st) -> str:
    """Plan against the peak the file's own events reach (not the figure the file states)."""
    events, incomplete = st["peak_bytes"], _gaps_in_the_file(trace, st)
    if events != trace.plan_peak:
        return f"the events' peak {fb(events)} differs by {events - trace.plan_peak:+d} B"
    return "the events' peak = plan, but the trace is incomplete" if incomplete else "measured = plan"


def _gaps_in_the_file(trace, st) -> list:
    """What shows that events are missing: a stated peak they do not reach, buffers never freed, steps with no span."""
    out = []
    if st["peak_bytes"] != trace.measured_peak:
        out.append(f"the file states a measured peak of {trace.measured_peak} B; its events reach {st['peak_bytes']} B")
    if st["unfreed"]:
        out.append(f"{len(st['unfreed'])} buffers are allocated and never freed (e.g. {st['unfreed'][0].tensor})")
    missing = st["steps_without_spans"]
    if missing:
        out.append(f"{len(missing)} of {len(trace.planned)} program steps have no span (e.g. step {missing[0]})")
    return out


def _part_times(trace) -> list:
    """(name, first step, last step, start, end) of each run with spans: its first span's start, its
    last span's end."""
    out = []
    for name, first, last in trace.parts:
        spans = [s for s in trace.spans if first <= s.step <= last]
        if spans:
            out.append((name, first, last, min(s.start for s in spans), max(s.end for s in spans)))
    return out


def _step_time(trace, st) -> str:
    """The measured step against the plan's prediction and the unsplit step with unlimited memory."""
    line = f"step time   {_ms(st['seconds']):>12}  measured"
    pred, unlimited = trace.predicted_seconds, trace.unlimited_seconds
    if pred is None:
        return line + "; no prediction in this trace"
    line += f"; predicted {_ms(pred)} (measured {st['seconds'] / pred:.2f}x)" if pred else f"; predicted {_ms(pred)}"
    if unlimited:
        line += (f"; the step unsplit with unlimited memory: predicted {_ms(unlimited)} "
                 f"({(pred / unlimited - 1) * 100:+.1f}%)")
    return line


def summary(trace, top=10) -> str:
    """The step's time against its prediction; the peak (the executor's high-water mark) and where the most
    bytes are live (step, layer, run, bytes by category, largest tensors); copies, overlap, stalls, plan."""
    st = stats(trace)
    n = Counter(s.kind for s in trace.spans)
    kinds = ", ".join(f"{n[k]} {k}" for k in ("forward", "backward", "recompute", "accumulate", "update", "offload",
                                              "prefetch", "allreduce") if n[k])
    lines = [f"trace: {trace.device}, iteration {trace.iteration}, {_ms(st['seconds'])}, {st['steps']} steps "
             f"({kinds})"]
    if trace.parts:
        lines.append(f"runs        {len(trace.parts)}: " + ", ".join(
            f"{name} (steps {a}-{b}, {_ms(end - start)})" for name, a, b, start, end in _part_times(trace)))
    lines.append(_step_time(trace, st))
    lines.append(f"peak        {fb(st['peak_bytes']):>12}  ({st['peak_bytes']} B): persistent + the arena's "
                 f"high-water mark")
    lines.append(f"plan peak   {fb(trace.plan_peak):>12}  ({trace.plan_peak} B): {_agreement(trace, st)}")
    lines += [f"INCOMPLETE  {what}" for what in _gaps_in_the_file(trace, st)]
    if trace.budget is not None:
        verdict = "CROSSED" if st["budget_crossed"] else f"{st['peak_bytes'] / trace.budget * 100:.1f}% used"
        lines.append(f"budget      {fb(trace.budget):>12}  ({trace.budget} B): {verdict}")
    sp, live = st["peak_span"], st["peak_live_bytes"]
    where = f", step {st['peak_step']}" + (f" {sp.name} ({sp.kind})" if sp else "")
    where += f", in {st['peak_part']}" if st["peak_part"] else ""
    plan = (f"; the plan's most: {fb(st['planned_peak_live_bytes'])} at step {st['planned_peak_step']}"
            if st["planned_peak_step"] is not None else "")
    lines.append(f"most live   {fb(live):>12}  ({live} B) at {_ms(st['peak_time'])}{where}{plan}")
    lines.append(f"at the peak (most bytes live), by category (free gaps below the high-water mark "
                 f"{fb(st['peak_bytes'] - live)}):")
    for c, b in st["peak_by_category"].items():
        if b:
            lines.append(f"    {c:<22}{fb(b):>12}")
    if top and st["peak_tensors"]:
        lines.append("largest tensors live at the peak:")
        lines += [f"    {fb(e.nbytes):>12}  {e.category:<20} {e.tensor}" for e in st["peak_tensors"][:top]]
    lines.append(f"offloaded   {fb(st['offload_bytes']):>12}  in {st['offloads']} copies "
                 f"({st['offloads_overlapping_forward']} overlapping the forward)")
    lines.append(f"prefetched  {fb(st['prefetch_bytes']):>12}  in {st['prefetches']} copies "
                 f"({st['prefetches_in_backward']} in the backward)")
    lines.append(f"copy stream busy {_ms(st['copy_seconds'])}, overlap with compute {st['overlap'] * 100:.1f}%; "
                 f"host store held {fb(st['host_peak_bytes'])} of {fb(trace.host_bytes)}")
    share = st["stall_seconds"] / st["seconds"] * 100 if st["seconds"] else 0.0
    lines.append(f"stall time  {_ms(st['stall_seconds'])} in {st['stalls']} waits ({share:.1f}% of the iteration); "
                 f"recompute {_ms(st['recompute_seconds'])} in {st['recomputes']} steps")
    if st["reductions"]:
        lines.append(f"collectives {_ms(st['comm_seconds'])} in {st['reductions']} (gradient buckets, BatchNorm); "
                     f"exposed communication {_ms(st['exposed_comm_seconds'])} (the compute waiting for them)")
    gaps = st["plan_gaps"]
    if not trace.planned:
        lines.append("plan vs measured: no planned curve in this trace")
    elif not gaps:
        lines.append(f"plan vs measured: live bytes agree at all {st['plan_steps_compared']} steps with memory "
                     f"events (of {len(trace.planned)} planned)")
    else:
        s = max(gaps, key=lambda s: abs(gaps[s]))
        lines.append(f"plan vs measured: live bytes differ at {len(gaps)} of {st['plan_steps_compared']} steps, "
                     f"most at step {s} ({gaps[s]:+d} B)")
    return "\n".join(lines)


def diff(a, b, names=("A", "B")) -> str:
    """Two traces side by side: the whole step's time and predictions, peaks, bytes by category where the most
    are live, copies, overlap, stalls."""
    sa, sb = stats(a), stats(b)

    def row(label, x, y, fmt):
        d = ""
        if x is not None and y is not None:
            d = f"{(y - x) * 100:+.1f} pts" if fmt is _pct else ("+" if y > x else "") + fmt(y - x)
            d += f" ({(y - x) / x * 100:+.1f}%)" if fmt is not _pct and x else ""
        show = (lambda v: "-" if v is None else fmt(v))
        return f"{label:<26}{show(x):>16}{show(y):>16}   {d}"

    fmt_b, fmt_s, fmt_n = fb, _ms, (lambda v: f"{v:g}")
    lines = [f"{'':<26}{names[0]:>16}{names[1]:>16}   {names[1]} - {names[0]}",
             row("iteration time", sa["seconds"], sb["seconds"], fmt_s),
             row("plan runs in the step", max(len(a.parts), 1), max(len(b.parts), 1), fmt_n),
             row("predicted step", a.predicted_seconds, b.predicted_seconds, fmt_s),
             row("unsplit, unlimited memory", a.unlimited_seconds, b.unlimited_seconds, fmt_s),
             row("peak (measured)", sa["peak_bytes"], sb["peak_bytes"], fmt_b),
             row("plan peak", a.plan_peak, b.plan_peak, fmt_b),
             row("most live", sa["peak_live_bytes"], sb["peak_live_bytes"], fmt_b),
             row("budget", a.budget, b.budget, fmt_b)]
    for c in dict.fromkeys(list(sa["peak_by_category"]) + list(sb["peak_by_category"])):
        lines.append(row(f"  at peak: {c}", sa["peak_by_category"].get(c, 0), sb["peak_by_category"].get(c, 0), fmt_b))
    for key, label, fmt in (("offload_bytes", "offloaded", fmt_b), ("prefetch_bytes", "prefetched", fmt_b),
                            ("copy_seconds", "copy stream busy", fmt_s), ("overlap", "overlap with compute", _pct),
                            ("stall_seconds", "stall time", fmt_s), ("stalls", "stalls", fmt_n),
                            ("recompute_seconds", "recompute time", fmt_s), ("host_peak_bytes", "host store", fmt_b)):
        lines.append(row(label, sa[key], sb[key], fmt))
    for k in ("forward", "backward", "update"):
        lines.append(row(f"{k} time", sa["seconds_by_kind"].get(k, 0.0), sb["seconds_by_kind"].get(k, 0.0), fmt_s))
    return "\n".join(lines)


def plot(trace, path, title=None) -> None:
    """PNG of the iteration (see :func:`figure`)."""
    figure(trace, title).savefig(path, dpi=110)


def figure(trace, title=None):
    """The matplotlib Figure of the iteration: stacked device memory by category (persistent at the bottom)
    over time, the budget line, the planned curve and the footprint, the peak (where the most bytes are
    live, and its layer), and beneath them the compute and copy stream lanes and, where there is one, the
    communication lane; a step run as several plans has each run's start marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    cats, rows = memory_curve(trace)
    high = max([r[3] for r in rows] + [trace.budget or 0])
    power = max(0, min(3, (high.bit_length() - 1) // 10))        # B, KiB, MiB or GiB on the axis
    unit, scale = ("B", "KiB", "MiB", "GiB")[power], 1 / 1024**power
    end = max(trace.duration, rows[-1][0]) * 1e3 or 1.0
    xs = [r[0] * 1e3 for r in rows] + [end]
    fig = Figure(figsize=(13, 7), layout="constrained")
    FigureCanvasAgg(fig)
    ax, lanes = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [4, 1]})
    ys = [[r[5][i] * scale for r in rows] + [rows[-1][5][i] * scale] for i in range(len(cats))]
    if cats:
        ax.stackplot(xs, *ys, labels=[c.replace("_", " ") for c in cats], step="post",
                     colors=[COLORS.get(c, "#9d7660") for c in cats], linewidth=0)
    ax.step(xs, [r[3] * scale for r in rows] + [rows[-1][3] * scale], where="post", color="black", lw=0.7,
            label="footprint (persistent + arena top)")
    times = step_times(trace)
    plan = sorted((times[s][0] * 1e3, n * scale) for s, n in trace.planned if s in times)
    if plan:
        ax.step([t for t, _ in plan] + [end], [n for _, n in plan] + [plan[-1][1]], where="post",
                color="#1f1f7a", ls="--", lw=1.2, label="plan")
    if trace.budget is not None:
        ax.axhline(trace.budget * scale, color="red", ls="-.", lw=1.5, label=f"budget {fb(trace.budget)}")
    st = stats(trace)
    sp = st["peak_span"]
    layer = f"step {st['peak_step']}" + (f" {sp.name} ({sp.kind})" if sp else "")
    ax.axvline(st["peak_time"] * 1e3, color="#7f0000", ls=":", lw=1.0)
    ax.annotate(f"peak: {fb(st['peak_live_bytes'])} live at {layer}" +
                (f", {st['peak_part']}" if st["peak_part"] else ""),
                (st["peak_time"] * 1e3, st["peak_live_bytes"] * scale), xytext=(4, 6), textcoords="offset points",
                fontsize=8, color="#7f0000")
    for name, _, _, t, _ in _part_times(trace)[1:]:
        for axis in (ax, lanes):
            axis.axvline(t * 1e3, color="grey", ls="--", lw=0.6)
        ax.text(t * 1e3, high * scale * 1.04, f" {name}", fontsize=7, color="dimgrey", va="top")
    ax.set_ylabel(f"device memory ({unit})")
    ax.set_ylim(0, high * scale * 1.08 or 1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.set_title(title or f"minidnn trace: {trace.device}, iteration {trace.iteration}, "
                 f"peak {fb(trace.measured_peak)}, step {_ms(st['seconds'])}" +
                 (f" (predicted {_ms(trace.predicted_seconds)})" if trace.predicted_seconds is not None else ""))
    streams = [s for s in STREAMS if s != "comm" or any(x.stream == "comm" for x in trace.spans)]
    lane = {stream: len(streams) - 1 - y for y, stream in enumerate(streams)}     # compute on top
    for stream, y in lane.items():
        spans = [s for s in trace.spans if s.stream == stream]
        lanes.broken_barh([(s.start * 1e3, (s.end - s.start) * 1e3) for s in spans], (y - 0.4, 0.8),
                          facecolors=[COLORS.get(s.kind, "grey") for s in spans], linewidth=0)
    kinds = [k for k in COLORS if k in {s.kind for s in trace.spans}]
    lanes.legend(handles=[Patch(color=COLORS[k], label=k) for k in kinds], loc="upper left",
                 bbox_to_anchor=(1.01, 1.25), fontsize=7, ncol=2)
    lanes.set_yticks(sorted(lane.values()), sorted(lane, key=lane.get))
    lanes.set_ylim(-0.6, len(streams) - 0.4)
    lanes.set_xlim(0, end)
    lanes.set_xlabel("time in the iteration (ms)")
    return fig


def from_plan(plan, device="cpu") -> Trace:
    """The trace a plan predicts: the two-stream simulator's times and the placement's offsets.

    ``diff(from_plan(plan), run)`` compares a run with its plan. A stall is a
    gap the simulator left on the compute stream before a step. A split step's
    plan predicts the whole step as its run records it: every sub-batch, then
    the update, one after the other (``parts``).
    """
    from .memory.plan import Plan
    from .memory.subbatch import ChunkedPlan, runs
    spans, events, planned, persistent, parts = [], [], [], {}, []
    start = first = 0
    whole_step = runs(plan)
    for name, p in whole_step:
        if p.simulation is None:
            raise ValueError("the plan has no simulation to predict its times from")
        for t in p.schedule.tensors:
            if t.persistent:
                persistent.setdefault(t.name, (t.name, t.category, aligned(t.nbytes)))
        _predict_run(p, start, first, spans, events)
        planned += [(first + i, p.persistent_bytes + c) for i, c in enumerate(p.live_curve)]
        parts.append((name, first, first + len(p.steps) - 1))
        start, first = start + p.simulation.seconds, first + len(p.steps)
    events.sort(key=lambda e: e.time)               # stable: a run's events keep their order
    whole = isinstance(plan, Plan)
    return Trace(device=device, budget=plan.budget, persistent=list(persistent.values()), spans=spans,
                 mem_events=events, planned=planned, plan_peak=plan.peak_bytes, measured_peak=plan.peak_bytes,
                 host_bytes=max(p.host_bytes for _, p in whole_step), meta={"source": "plan", "policy": plan.policy},
                 predicted_seconds=plan.predicted_seconds,
                 unlimited_seconds=None if isinstance(plan, ChunkedPlan) else plan.unlimited_seconds,
                 parts=[] if whole else parts)


def _predict_run(plan, start, first, spans, events) -> None:
    """Append the spans and memory events one run of the whole ``plan`` is predicted to make, its times
    from ``start`` (seconds) and its steps from ``first``."""
    prog, sim = plan.program, plan.simulation
    tensors = prog.tensors
    allocs, frees = defaultdict(list), defaultdict(list)
    for k, r in enumerate(prog.residencies):
        allocs[r.start].append(k)
        frees[r.end].append(k)
    host = {}
    clock = last = 0.0                      # where the compute stream is; the last event's time

    def add(t, action, tensor, category, nbytes, offset, step):
        nonlocal last
        last = max(last, t)
        events.append(MemEvent(start + last, action, tensor.name, category, aligned(nbytes), offset, first + step))

    def span(stream, name, kind, i, a, b, nbytes=0):
        spans.append(Span(stream, name, kind, first + i, start + a, start + b, nbytes))

    for i, s in enumerate(prog.steps):
        copy = sim.stream[i] == "copy"
        issue = clock if copy else sim.start[i]
        if not copy and sim.start[i] > clock:
            span("compute", f"wait before {s.label}", "stall", i, clock, sim.start[i])
        for k in allocs[i]:
            t = tensors[prog.residencies[k].tensor]
            add(issue, "alloc", t, t.category, t.nbytes, plan.offsets[k], i)
        if copy:
            t = tensors[(s.reads or s.writes)[0]]
            span("copy", s.label, s.kind, i, sim.start[i], sim.end[i], t.nbytes)
            if s.kind == "offload" and t.id not in host:
                host[t.id] = t
                add(issue, "alloc", t, HOST_COPY, t.nbytes, prog.host_slots[t.id], i)
        else:
            span("compute", s.label, s.kind, i, sim.start[i], sim.end[i])
            clock = sim.end[i]
        for k in frees[i]:
            t = tensors[prog.residencies[k].tensor]
            add(issue if copy else sim.end[i], "free", t, t.category, t.nbytes, plan.offsets[k], i)
    for t in host.values():                 # the host store keeps its copies to the end of the run
        add(sim.seconds, "free", t, HOST_COPY, t.nbytes, prog.host_slots[t.id], len(prog.steps) - 1)
