"""Traces: the Chrome Trace Event export (structure, nesting, counters), the lossless round trip,
the PyTorch memory snapshot (read by torch's own tooling), CSV, summary, diff, plot, the trace a
plan predicts, and clear errors for truncated or foreign files."""

import csv
import gzip
import json
import pickle
import pickletools
from dataclasses import replace

import pytest

import minidnn
from minidnn import nn, optim
from minidnn import trace as T
from minidnn.trace import MemEvent, Recorder, Span, Trace, TraceError

PERSISTENT = [("fc.weight", "parameter", 4096), ("fc.weight.grad", "gradient", 4096),
              ("fc.weight.momentum_buffer", "optimizer_state", 4096)]
ARENA_PEAK = 6144                                 # the prefetched conv1 lands at [4096, 6144)
SPANS = [  # one small iteration: an offload overlapping the forward, a prefetch in the backward, a stall
    Span("compute", "load", "load", 0, 0.0, 0.001),
    Span("compute", "conv1:conv2d", "forward", 1, 0.001, 0.003),
    Span("copy", "offload conv1:conv2d", "offload", 2, 0.003, 0.005, 2048),
    Span("compute", "fc:linear", "forward", 3, 0.003, 0.006),
    Span("copy", "prefetch conv1:conv2d", "prefetch", 4, 0.006, 0.0085, 2048),
    Span("compute", "fc:linear", "backward", 5, 0.006, 0.008),
    Span("compute", "wait for prefetch conv1:conv2d", "stall", 6, 0.008, 0.0085),
    Span("compute", "conv1:conv2d", "backward", 6, 0.0085, 0.010),
    Span("compute", "update fc.weight", "update", 7, 0.010, 0.011),
]
EVENTS = [
    MemEvent(0.0, "alloc", "input", "input", 1024, 0, 0),
    MemEvent(0.001, "alloc", "conv1:conv2d", "activation", 2048, 1024, 1),
    MemEvent(0.001, "alloc", "conv1:conv2d:workspace", "workspace", 512, 3072, 1),
    MemEvent(0.003, "free", "conv1:conv2d:workspace", "workspace", 512, 3072, 1),
    MemEvent(0.003, "alloc", "conv1:conv2d", "host_copy", 2048, 0, 2),
    MemEvent(0.003, "alloc", "fc:linear", "activation", 1024, 3072, 3),
    MemEvent(0.006, "free", "conv1:conv2d", "activation", 2048, 1024, 3),     # its offload is done
    MemEvent(0.006, "alloc", "conv1:conv2d", "activation", 2048, 4096, 4),    # prefetched: the peak
    MemEvent(0.006, "alloc", "grad fc:linear", "activation_gradient", 1024, 1024, 5),
    MemEvent(0.008, "free", "fc:linear", "activation", 1024, 3072, 5),
    MemEvent(0.0085, "alloc", "conv1:conv2d:workspace", "workspace", 512, 3072, 6),
    MemEvent(0.010, "free", "conv1:conv2d:workspace", "workspace", 512, 3072, 6),
    MemEvent(0.010, "free", "conv1:conv2d", "activation", 2048, 4096, 6),
    MemEvent(0.010, "free", "grad fc:linear", "activation_gradient", 1024, 1024, 6),
    MemEvent(0.010, "free", "input", "input", 1024, 0, 6),
    MemEvent(0.011, "free", "conv1:conv2d", "host_copy", 2048, 0, 7),
]
BASE = 12288
PLANNED = [(0, BASE + 1024), (1, BASE + 3584), (2, BASE + 3072), (3, BASE + 4096), (4, BASE + 4096),
           (5, BASE + 5120), (6, BASE + 4608), (7, BASE)]


def fake_trace(**kw) -> Trace:
    fields = dict(device="cpu", budget=20000, persistent=list(PERSISTENT), spans=list(SPANS),
                  mem_events=list(EVENTS), planned=list(PLANNED), plan_peak=BASE + ARENA_PEAK,
                  measured_peak=BASE + ARENA_PEAK, host_bytes=2048, iteration=3, meta={"model": "toy"})
    fields.update(kw)
    return Trace(**fields)


def _thread_nesting_errors(events):
    """Complete events on one thread must be disjoint or nested (Perfetto rejects partial overlaps)."""
    errors, by_thread = [], {}
    for e in events:
        if e["ph"] == "X":   # back to Perfetto's integer nanoseconds
            a = round(e["ts"] * 1000)
            by_thread.setdefault((e["pid"], e["tid"]), []).append((a, a + round(e["dur"] * 1000), e["name"]))
    for thread, spans in by_thread.items():
        stack = []
        for a, b, name in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= a:
                stack.pop()
            if stack and b > stack[-1][1]:
                errors.append(f"{thread}: {name} partially overlaps {stack[-1][2]}")
            stack.append((a, b, name))
    return errors


# -- the Chrome Trace Event export -----------------------------------------------------------------

def test_chrome_trace_structure(tmp_path):
    trace = fake_trace()
    assert T.problems(trace) == []
    path = tmp_path / "trace.json"
    trace.save(path)
    doc = json.loads(path.read_text())
    # Perfetto stops at the first top-level key it does not know, so the trace events come first
    keys = list(doc)
    assert keys.index("traceEvents") < keys.index("format") and keys.index("traceEvents") < keys.index("minidnn")
    assert doc["displayTimeUnit"] in ("ms", "ns")
    events = doc["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X", "C"}

    meta = [e for e in events if e["ph"] == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    device_pid = next(p for p, n in processes.items() if "cpu" in n)
    assert sorted(n for (p, _), n in threads.items() if p == device_pid) == ["compute stream", "copy stream"]

    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == len(trace.spans)
    tid = {n.split()[0]: t for (p, t), n in threads.items()}
    for e in spans:
        assert e["dur"] >= 0 and e["ts"] >= 0 and e["pid"] == device_pid
        assert e["cat"] in T.KINDS and isinstance(e["name"], str)
    assert {e["cat"] for e in spans if e["tid"] == tid["copy"]} == {"offload", "prefetch"}
    stalls = [e for e in spans if e["cat"] == "stall"]
    assert len(stalls) == 1 and stalls[0]["tid"] == tid["compute"] and stalls[0]["dur"] == 500.0
    assert _thread_nesting_errors(events) == []

    counters = [e for e in events if e["ph"] == "C"]
    for e in counters:
        assert e["args"] and all(isinstance(v, int) and v >= 0 for v in e["args"].values()), e
    names = {e["name"] for e in counters}
    assert {"device memory by category", "device bytes (planned)", "device bytes (measured)",
            "host store bytes", "budget"} <= names
    by_cat = [e for e in counters if e["name"] == "device memory by category"]
    assert {"parameter", "gradient", "optimizer_state", "activation", "workspace"} <= set(by_cat[0]["args"])
    assert by_cat[0]["args"]["parameter"] == 4096 and sum(by_cat[0]["args"].values()) == BASE  # the base
    # the measured peak on the counters is the executor's own account, and the budget holds
    footprint = max(e["args"]["bytes"] for e in counters if e["name"].startswith("device footprint"))
    assert footprint == trace.measured_peak == BASE + ARENA_PEAK <= trace.budget
    assert max(sum(e["args"].values()) for e in by_cat) <= footprint
    assert max(e["args"]["bytes"] for e in counters if e["name"] == "host store bytes") == 2048
    planned = [e["args"]["bytes"] for e in counters if e["name"] == "device bytes (planned)"]
    assert planned == [n for s, n in PLANNED if s not in (2, 4)]      # placed at compute steps


def test_partial_overlaps_and_bad_accounting_are_reported():
    clash = Span("compute", "late", "forward", 9, 0.0025, 0.0035)          # straddles conv1's end
    problems = T.problems(fake_trace(spans=SPANS + [clash]))
    assert any("partially overlaps" in p for p in problems)
    assert _thread_nesting_errors(T.to_chrome(fake_trace(spans=SPANS + [clash]))["traceEvents"])
    assert any("measured peak" in p for p in T.problems(fake_trace(measured_peak=BASE + 4096)))
    stray = MemEvent(0.0105, "free", "ghost", "activation", 64, 9000, 7)
    assert any("never allocated" in p for p in T.problems(fake_trace(mem_events=EVENTS + [stray])))


# -- the lossless file -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["trace.json", "trace.json.gz"])
def test_save_load_round_trip(tmp_path, name):
    trace = fake_trace()
    path = tmp_path / name
    trace.save(path)
    back = T.load(path)
    assert back == trace
    assert isinstance(back.spans[0], Span) and isinstance(back.mem_events[0], MemEvent)
    assert back.planned[0] == PLANNED[0] and back.persistent[0] == PERSISTENT[0]
    if name.endswith(".gz"):
        assert "traceEvents" in json.loads(gzip.decompress(path.read_bytes()))


def test_recorder_samples_and_builds_a_trace():
    now = [100.0]
    rec = Recorder(every=2, clock=lambda: now[0])
    assert rec.begin(1) is False
    assert rec.begin(2) is True
    for s in reversed(SPANS):                           # the copy thread may append out of order
        rec.span(s.stream, s.name, s.kind, s.step, 100.0 + s.start, 100.0 + s.end, s.nbytes)
    for e in EVENTS:
        rec.mem(100.0 + e.time, e.action, e.tensor, e.category, e.nbytes, e.offset, e.step)
    rec.end(device="cpu", budget=20000, persistent=list(PERSISTENT), planned=list(PLANNED),
            plan_peak=BASE + ARENA_PEAK, measured_peak=BASE + ARENA_PEAK, host_bytes=2048, iteration=2)
    assert rec.spans == [] and rec.events == []          # the next iteration starts empty
    got = rec.trace
    assert rec.trace is got and got.iteration == 2
    assert [e.time for e in got.mem_events] == pytest.approx([e.time for e in EVENTS])
    assert sorted((s.name, s.kind, s.step) for s in got.spans) == sorted((s.name, s.kind, s.step) for s in SPANS)
    assert [s.start for s in got.spans] == sorted(s.start for s in got.spans)
    assert T.problems(got) == []
    assert rec.begin(4) and rec.trace is got            # the last closed iteration stays readable


# -- the PyTorch memory snapshot ----------------------------------------------------------------------

def test_memory_snapshot_layout():
    snap = T.to_memory_snapshot(fake_trace())
    for seg in snap["segments"]:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    device = snap["device_traces"][0]
    allocs = [e for e in device if e["action"] == "alloc"]
    assert len(allocs) == len(PERSISTENT) + sum(e.action == "alloc" and e.category != "host_copy" for e in EVENTS)
    assert [e["action"] for e in device].count("free_requested") == [e["action"] for e in device].count(
        "free_completed")
    live = sum(e["size"] * {"alloc": 1, "free_completed": -1}.get(e["action"], 0) for e in device)
    active = sum(b["size"] for s in snap["segments"] if s["device"] == 0 for b in s["blocks"]
                 if b["state"] == "active_allocated")
    assert live == active == BASE          # only the persistent region is held at the end
    arena = [s for s in snap["segments"] if s["device"] == 0][-1]
    assert arena["total_size"] == ARENA_PEAK
    # the host store is host memory, not a second device: memory_viz shows one device, and the host
    # store's copies are kept beside it
    assert len(snap["device_traces"]) == 1 and {s["device"] for s in snap["segments"]} == {0}
    host = snap["host_store"]
    assert [e["category"] for e in host["trace"]] == ["host_copy"] * 3 and host["total_size"] == 2048


def test_memory_snapshot_reads_in_pytorch_memory_viz(tmp_path):
    pytest.importorskip("torch")
    from torch.cuda import _memory_viz as viz
    path = tmp_path / "snapshot.pickle"
    fake_trace().save_memory_snapshot(path)
    raw = path.read_bytes()
    assert raw[:2] == b"\x80\x04"                      # protocol 4
    # only opcodes that memory_viz's JavaScript unpickler implements
    readable = {"PROTO", "FRAME", "STOP", "MARK", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET",
                "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "SETITEM", "SETITEMS", "APPEND", "APPENDS", "DICT",
                "LIST", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1",
                "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE"}
    assert {op.name for op, _, _ in pickletools.genops(raw)} <= readable
    snap = pickle.loads(raw)
    html = viz.trace_plot(snap)
    assert isinstance(html, str) and "<html>" in html and "snapshot.pickle" in html
    assert isinstance(viz.segment_plot(snap), str)
    text = viz.trace(snap)                              # torch's own reading of every entry
    assert "Device 0" in text and "Device 1" not in text and "del " in text
    assert "total_allocated: 12.0KiB" in viz.segsum(snap)


# -- CSV, summary, diff, plot ---------------------------------------------------------------------------

def test_csv_memory_curve(tmp_path):
    trace = fake_trace()
    path = tmp_path / "memory.csv"
    T.to_csv(trace, path)
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert {"time_s", "tensor", "category", "device_bytes", "footprint_bytes", "host_store_bytes",
            "planned_bytes", "activation_bytes", "parameter_bytes"} <= set(rows[0])
    assert len(rows) == len(EVENTS) + 1
    times = [float(r["time_s"]) for r in rows]
    assert times == sorted(times)
    assert max(int(r["footprint_bytes"]) for r in rows) == trace.measured_peak
    assert int(rows[0]["device_bytes"]) == int(rows[-1]["device_bytes"]) == BASE


def test_summary_names_the_peak_categories_and_stalls():
    text = T.summary(fake_trace())
    assert str(BASE + ARENA_PEAK) in text and "measured = plan" in text
    # the peak: the executor's high-water mark, placed where the most bytes are live (step 5, as planned)
    assert f"peak           18.00 KiB  ({BASE + ARENA_PEAK} B): persistent + the arena's high-water mark" in text
    assert ("most live      17.00 KiB  (17408 B) at 6.00 ms, step 5 fc:linear (backward); "
            "the plan's most: 17.00 KiB at step 5") in text
    assert "free gaps below the high-water mark 1.00 KiB" in text
    for word in ("parameter", "gradient", "optimizer_state", "activation", "input", "stall time  0.50 ms",
                 "offloaded", "prefetched", "1 overlapping the forward", "1 in the backward", "budget"):
        assert word in text, word
    assert "agree at all 6 steps" in text
    largest = text.split("largest tensors live at the peak:")[1].splitlines()[1]
    assert "conv1:conv2d" in largest and "activation" in largest
    st = T.stats(fake_trace())
    assert st["offloads_overlapping_forward"] == 1 and st["prefetches_in_backward"] == 1
    assert st["overlap"] == pytest.approx(4 / 4.5)     # the stall exposes 0.5 ms of the prefetch
    assert st["stall_seconds"] == pytest.approx(0.0005)
    assert not st["budget_crossed"]
    assert "CROSSED" in T.summary(fake_trace(budget=BASE + 4096))
    moved = fake_trace(planned=[(s, n + 64 * (s == 5)) for s, n in PLANNED])
    assert "differ at 1 of 6 steps, most at step 5 (-64 B)" in T.summary(moved)


def test_diff_two_runs():
    a = fake_trace()
    b = fake_trace(spans=[replace(s, end=s.end + 0.002) if s.kind == "update" else s for s in SPANS])
    text = T.diff(a, b, names=("run1", "run2"))
    assert "run1" in text.splitlines()[0] and "run2" in text.splitlines()[0]
    line = next(ln for ln in text.splitlines() if ln.startswith("iteration time"))
    assert "11.00 ms" in line and "13.00 ms" in line and "+2.00 ms" in line
    assert "stall time" in text and "at peak: activation" in text


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "memory.png"
    T.plot(fake_trace(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the trace a plan predicts ---------------------------------------------------------------------------

def _plan(budget=None):
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(8 * 8 * 8, 10)).init_parameters(0)
    return minidnn.compile(net, (16, 3, 16, 16), nn.CrossEntropyLoss(), optim.SGD(lr=0.1, momentum=0.9),
                           memory=minidnn.MemoryConfig(budget=budget, sub_batching=False)).plan


def test_trace_predicted_by_a_budgeted_plan(tmp_path):
    with pytest.raises(minidnn.MemoryBudgetError) as e:
        _plan(1)
    plan = _plan(e.value.minimum_bytes)
    trace = T.from_plan(plan)
    assert T.problems(trace) == []
    assert trace.measured_peak == plan.peak_bytes <= plan.budget
    st = T.stats(trace)
    assert st["peak_bytes"] == plan.peak_bytes and not st["budget_crossed"] and not st["plan_gaps"]
    kinds = {s.kind for s in trace.spans}
    assert kinds & {"offload", "recompute"}
    assert {s.stream for s in trace.spans if s.kind in ("offload", "prefetch")} <= {"copy"}
    trace.save(tmp_path / "plan.json")
    assert T.load(tmp_path / "plan.json") == trace
    assert "plan peak" in T.diff(T.from_plan(_plan()), trace, names=("unlimited", "budget"))


# -- bad files ---------------------------------------------------------------------------------------------

def test_truncated_and_foreign_files_raise_a_clear_error(tmp_path):
    good = tmp_path / "good.json"
    fake_trace().save(good)
    text = good.read_text()
    cases = {
        "truncated.json": (text[: len(text) // 2], "truncated"),
        "foreign.json": (json.dumps({"hello": 1}), "not a minidnn trace"),
        "chrome.json": (json.dumps(T.to_chrome(fake_trace())), "Chrome trace"),
        "list.json": (json.dumps([{"ph": "X"}]), "Chrome trace"),
        "newer.json": (text.replace(f'"version":{T.VERSION}', '"version":99'), "version 99"),
        "nospans.json": (text.replace('"spans":[[', '"spanz":[['), "'spans'"),
        "badrow.json": (text.replace('"mem_events":[[', '"mem_events":[[1,'), "'mem_events'"),
        "badtype.json": (text.replace('"mem_events":[[0.0,"alloc","input","input",1024',
                                      '"mem_events":[[0.0,"alloc","input","input","lots"'), "'mem_events'"),
        "unpaired.json": (text.replace('"mem_events":[[0.0,"alloc",', '"mem_events":[[0.0,"free",'),
                          "never allocated"),
        "empty.json": ("", "truncated"),
    }
    for name, (content, words) in cases.items():
        path = tmp_path / name
        path.write_text(content)
        with pytest.raises(TraceError) as e:
            T.load(path)
        assert str(path) in str(e.value) and words in str(e.value), (name, str(e.value))
    binary = {"snapshot.pickle": (pickle.dumps({"segments": []}, protocol=4), "pickle"),
              "noise.bin": (bytes(range(128, 256)), "binary"),
              "cut.json.gz": (gzip.compress(text.encode())[:200], "gzip")}
    for name, (content, words) in binary.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(TraceError, match=words):
            T.load(path)
    with pytest.raises(TraceError, match="missing.json"):
        T.load(tmp_path / "missing.json")
    assert issubclass(TraceError, ValueError) and issubclass(TraceError, minidnn.MinidnnError)
