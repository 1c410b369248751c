"""A split step is traced whole (every sub-batch, every stage, then the update), and a trace's peak is
the real one: the executor's own high-water account, placed where the most bytes are live (issue #31,
items 1 and 2). Memory figures are exact bytes, compared with the plan's."""

import numpy as np
import pytest

import minidnn
from minidnn import cli, nn, optim
from minidnn import trace as T
from minidnn.memory.subbatch import StagedPlan, SubBatchPlan
from minidnn.report import plan_dict
from minidnn.trace import MemEvent, Recorder, Span, Trace

SHAPE = (16, 3, 16, 16)
CLASSES = 10


def _net(batch_norm):
    layers = ([nn.Conv2d(3, 8, 3, padding=1)] + ([nn.BatchNorm2d(8)] if batch_norm else []) +
              [nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
               nn.Linear(8 * 8 * 8, CLASSES)])
    return nn.Sequential(*layers).init_parameters(0)


def _trainer(batch_norm=False, budget=None, sub_batching=True):
    return minidnn.compile(_net(batch_norm), SHAPE, nn.CrossEntropyLoss(), optim.SGD(lr=0.1, momentum=0.9),
                           memory=minidnn.MemoryConfig(budget=budget, sub_batching=sub_batching))


def _stepped(trainer):
    rng = np.random.default_rng(0)
    trainer.step(rng.standard_normal(SHAPE).astype(np.float32), rng.integers(0, CLASSES, SHAPE[0]))
    return trainer


def _below_the_whole_step(batch_norm):
    """A budget the whole step cannot meet (its lower bound): the step is split."""
    return _trainer(batch_norm).plan.lower_bound_bytes


@pytest.fixture(scope="module")
def split():
    """A trainer whose step runs as sub-batches (no BatchNorm: k runs of one sub-batch's plan, then the
    update), after one recorded step."""
    trainer = _stepped(_trainer(budget=_below_the_whole_step(False)))
    assert isinstance(trainer.plan, SubBatchPlan) and trainer.plan.k > 1
    return trainer


@pytest.fixture(scope="module")
def whole():
    return _stepped(_trainer())


def _executor_peak(trainer):
    """The executor's own account of the step: the persistent store + its arena high-water mark."""
    return trainer.store.nbytes + trainer.executor.high_water_bytes


# -- item 1: every sub-batch and the update, as one iteration ------------------------------------------

def test_every_sub_batch_and_the_update_are_traced_as_one_iteration(split):
    plan, trace = split.plan, split.trace
    k, sub, update = plan.k, plan.sub, plan.update
    assert T.problems(trace) == []
    assert [name for name, _, _ in trace.parts] == [f"sub-batch {j + 1} of {k}" for j in range(k)] + ["update"]
    total = k * len(sub.steps) + len(update.steps)
    assert trace.parts[-1][2] == total - 1
    assert {s.step for s in trace.spans if s.step >= 0} == set(range(total))     # every program step of every run
    forward = sum(s.kind == "forward" for s in sub.steps)
    assert sum(s.kind == "forward" for s in trace.spans) == k * forward
    updates = [s for s in trace.spans if s.kind == "update"]
    assert len(updates) == sum(s.kind == "update" for s in update.steps) > 0
    last_backward = max(s.end for s in trace.spans if s.kind == "backward")
    assert min(s.start for s in updates) >= last_backward
    first, last = trace.parts[0], trace.parts[-2]
    assert [s for s in trace.spans if s.kind == "backward" and first[1] <= s.step <= first[2]]
    assert [s for s in trace.spans if s.kind == "backward" and last[1] <= s.step <= last[2]]
    # the planned curve: each run's, end to end
    expected = [(j * len(sub.steps) + i, sub.persistent_bytes + c) for j in range(k)
                for i, c in enumerate(sub.live_curve)]
    expected += [(k * len(sub.steps) + i, update.persistent_bytes + c) for i, c in enumerate(update.live_curve)]
    assert trace.planned == expected


def test_the_split_trace_carries_the_whole_step_bytes_and_predictions(split):
    plan, trace = split.plan, split.trace
    assert trace.measured_peak == trace.plan_peak == plan.peak_bytes == _executor_peak(split)
    assert T.stats(trace)["peak_bytes"] == plan.peak_bytes
    assert trace.predicted_seconds == plan.predicted_seconds == (
        plan.k * plan.sub.simulation.seconds + plan.update.simulation.seconds)
    assert trace.unlimited_seconds == plan.unsplit_seconds is not None


def test_a_staged_step_carries_the_whole_step_predictions():
    trainer = _stepped(_trainer(True, _below_the_whole_step(True)))
    plan, trace = trainer.plan, trainer.trace
    assert isinstance(plan, StagedPlan) and plan.k > 1
    assert T.problems(trace) == []
    assert len(trace.parts) == 1 and trace.parts[0][1:] == (0, len(plan.plan.steps) - 1)
    assert any(s.kind == "update" for s in trace.spans)
    assert trace.measured_peak == plan.peak_bytes == _executor_peak(trainer)
    assert trace.predicted_seconds == plan.predicted_seconds
    assert trace.unlimited_seconds == plan.unsplit_seconds is not None


def test_the_predicted_split_step_is_the_whole_step_and_diff_compares_whole_steps(split):
    plan = split.plan
    unsplit = _trainer().plan                       # the same step, unsplit, with unlimited memory
    assert unsplit.predicted_seconds == pytest.approx(plan.unsplit_seconds)
    predicted = T.from_plan(plan)
    assert T.problems(predicted) == []
    assert predicted.duration == pytest.approx(plan.predicted_seconds)
    assert predicted.measured_peak == plan.peak_bytes == max(r[3] for r in T.memory_curve(predicted)[1])
    assert [name for name, _, _ in predicted.parts] == [name for name, _, _ in split.trace.parts]
    over = plan.predicted_seconds / unsplit.predicted_seconds - 1
    assert over > 0
    text = T.diff(T.from_plan(unsplit), predicted, names=("unsplit", "split"))
    line = next(ln for ln in text.splitlines() if ln.startswith("iteration time"))
    assert line.endswith(f"({over * 100:+.1f}%)"), line
    runs = next(ln for ln in text.splitlines() if ln.startswith("plan runs in the step"))
    assert runs.split()[-4:-2] == ["1", str(plan.k + 1)]


def test_the_plan_summary_and_json_report_the_whole_step(split):
    plan = split.plan
    text = plan.summary()
    head, rest = text.split("\n", 1)
    over = plan.predicted_seconds / plan.unsplit_seconds - 1
    assert f"predicted step {plan.predicted_seconds * 1e3:.2f} ms" in head
    unsplit = f"{plan.unsplit_seconds * 1e3:.2f} ms, the unsplit step with unlimited memory"
    assert f"({over * 100:+.1f}% vs {unsplit})" in head
    # one sub-batch's own figures are that run's, not presented as the step's against unlimited memory
    assert "% vs unlimited memory" not in text and "predicted step " not in rest
    assert "% vs the same run with unlimited memory" in rest
    d = plan_dict(plan, "toy", SHAPE, "cpu-2core")
    pred = d["prediction"]
    assert pred["step_seconds"] == plan.predicted_seconds
    assert pred["unlimited_memory_seconds"] == plan.unsplit_seconds
    for name in ("compute_seconds", "copy_seconds", "stall_seconds", "offload_bytes", "prefetch_bytes"):
        whole_step = plan.k * getattr(plan.sub.simulation, name) + getattr(plan.update.simulation, name)
        assert pred[name] == pytest.approx(whole_step), name
    assert d["steps"] == plan.k * len(plan.sub.steps) + len(plan.update.steps)


def test_the_summary_reports_the_runs_and_the_step_against_predicted_and_unlimited(split, tmp_path, capsys):
    plan, trace = split.plan, split.trace
    path = tmp_path / "split.json"
    trace.save(path)
    assert T.load(path) == trace                      # the new fields survive the file
    capsys.readouterr()
    assert cli.main(["trace", "summary", str(path)]) == 0
    out = capsys.readouterr().out
    n = len(plan.sub.steps)
    assert f"runs        {plan.k + 1}: sub-batch 1 of {plan.k} (steps 0-{n - 1}, " in out
    assert f"update (steps {plan.k * n}-{plan.k * n + len(plan.update.steps) - 1}, " in out
    step = next(ln for ln in out.splitlines() if ln.startswith("step time"))
    assert f"predicted {plan.predicted_seconds * 1e3:.2f} ms" in step
    assert (f"the step unsplit with unlimited memory: predicted {plan.unsplit_seconds * 1e3:.2f} ms "
            f"({plan.predicted_overhead * 100:+.1f}%)") in step


# -- item 2: the real peak -----------------------------------------------------------------------------

def _plans_peak_step(plan):
    curve = plan.live_curve
    return max(range(len(curve)), key=curve.__getitem__)


def test_the_peak_is_the_executors_account_placed_where_the_most_bytes_are_live(whole):
    plan, trace = whole.plan, whole.trace
    st = T.stats(trace)
    at = _plans_peak_step(plan)
    assert st["peak_bytes"] == trace.measured_peak == plan.peak_bytes == _executor_peak(whole)
    assert st["peak_step"] == at and st["peak_span"].step == at
    assert st["peak_live_bytes"] == plan.persistent_bytes + plan.live_curve[at]
    prog = plan.program
    live = sorted(prog.tensors[r.tensor].name for r in prog.residencies if r.start <= at <= r.end)
    assert sorted(e.tensor for e in st["peak_tensors"]) == live
    text = T.summary(trace)
    most = next(ln for ln in text.splitlines() if ln.startswith("most live"))
    assert f"step {at} {plan.steps[at].label} ({plan.steps[at].kind})" in most
    assert f"({st['peak_live_bytes']} B)" in most
    largest = text.split("largest tensors live at the peak:\n")[1].splitlines()[0]
    biggest = max((r for r in prog.residencies if r.start <= at <= r.end),
                  key=lambda r: prog.tensors[r.tensor].nbytes)
    assert largest.endswith(prog.tensors[biggest.tensor].name)


def test_the_split_steps_peak_names_its_run(split):
    plan, st = split.plan, T.stats(split.trace)
    at = _plans_peak_step(plan.sub)                 # the update holds less than a sub-batch here
    assert plan.sub.peak_bytes >= plan.update.peak_bytes
    assert st["peak_step"] == at and st["peak_part"] == f"sub-batch 1 of {plan.k}"
    assert st["peak_live_bytes"] == plan.sub.persistent_bytes + plan.sub.live_curve[at]


def test_an_input_placed_at_the_arena_top_is_not_the_peak():
    """The footprint reaches its high-water mark at the first allocation (the input sits at the top of
    the arena); the peak is where the most bytes are live, and the tensors listed are those there."""
    base = 4096
    spans = [Span("compute", "load", "load", 0, 0.0, 0.001),
             Span("compute", "a:conv2d", "forward", 1, 0.001, 0.002),
             Span("compute", "b:conv2d", "forward", 2, 0.002, 0.003),
             Span("compute", "c:linear", "forward", 3, 0.003, 0.004)]
    events = [MemEvent(0.0, "alloc", "input", "input", 512, 4096, 0),
              MemEvent(0.001, "alloc", "a:conv2d", "activation", 2048, 0, 1),
              MemEvent(0.002, "alloc", "b:conv2d", "activation", 1536, 2048, 2),
              MemEvent(0.003, "free", "a:conv2d", "activation", 2048, 0, 2),
              MemEvent(0.003, "alloc", "c:linear", "activation", 256, 0, 3),
              MemEvent(0.004, "free", "c:linear", "activation", 256, 0, 3),
              MemEvent(0.004, "free", "b:conv2d", "activation", 1536, 2048, 3),
              MemEvent(0.004, "free", "input", "input", 512, 4096, 3)]
    trace = Trace(persistent=[("w", "parameter", base)], spans=spans, mem_events=events,
                  planned=[(0, base + 512), (1, base + 2560), (2, base + 4096), (3, base + 2304)],
                  plan_peak=base + 4608, measured_peak=base + 4608)
    st = T.stats(trace)
    assert st["peak_bytes"] == base + 4608 and st["peak_live_bytes"] == base + 4096 and st["peak_step"] == 2
    text = T.summary(trace)
    assert "most live       8.00 KiB  (8192 B) at 2.00 ms, step 2 b:conv2d (forward)" in text
    assert "the plan's most: 8.00 KiB at step 2" in text
    largest = text.split("largest tensors live at the peak:\n")[1].splitlines()[:3]
    assert [ln.split()[-1] for ln in largest] == ["a:conv2d", "b:conv2d", "input"]


# -- the recording of a step run as several plans ---------------------------------------------------------

def test_a_split_recording_shifts_steps_and_records_shared_spans_once():
    now = [10.0]
    rec = Recorder(clock=lambda: now[0])
    whole = T.SplitRecording(rec, 4)
    persistent = [("w", "parameter", 64)]
    for t, name, steps, high in ((10.0, "sub-batch 1 of 2", 3, 128), (10.01, "update", 2, 32)):
        part = whole.part(name, steps)
        assert part.begin(4) is True
        part.span("compute", f"{name} work", "forward", 1, t, t + 0.001)
        part.span("comm", "all-reduce bucket 0", "allreduce", -1, 10.002, 10.003, 16)   # seen by both runs
        part.mem(t, "alloc", "x", "activation", 32, 0, 0)
        part.mem(t + 0.001, "free", "x", "activation", 32, 0, steps - 1)
        part.end(device="cpu", budget=None, persistent=persistent, planned=[(i, 96) for i in range(steps)],
                 plan_peak=64 + high, measured_peak=64 + high, host_bytes=0, iteration=4)
    assert rec.trace is None                         # closed once, by the whole step
    whole.end(plan_peak=192, budget=256, predicted_seconds=0.5, unlimited_seconds=0.25)
    trace = rec.trace
    assert trace.parts == [("sub-batch 1 of 2", 0, 2), ("update", 3, 4)]
    assert sorted(s.step for s in trace.spans if s.kind == "forward") == [1, 4]
    assert sum(s.stream == "comm" for s in trace.spans) == 1
    assert [e.step for e in trace.mem_events] == [0, 2, 3, 4]
    assert trace.planned == [(i, 96) for i in range(5)] and trace.persistent == persistent
    assert (trace.plan_peak, trace.measured_peak, trace.budget) == (192, 192, 256)
    assert (trace.predicted_seconds, trace.unlimited_seconds, trace.iteration) == (0.5, 0.25, 4)
    skipped = T.SplitRecording(Recorder(every=2), 3)   # an iteration the recorder does not sample
    assert skipped.part("sub-batch 1 of 2", 3) is None


def test_the_figure_marks_the_peak_layer_the_runs_and_a_communication_lane(split):
    pytest.importorskip("matplotlib")
    plan, trace = split.plan, split.trace
    st = T.stats(trace)

    def lanes_and_texts(t):
        memory, lanes = T.figure(t).axes[:2]
        return [x.get_text() for x in lanes.get_yticklabels()], [x.get_text() for x in memory.texts]

    labels, texts = lanes_and_texts(trace)
    assert labels == ["copy", "compute"]                         # no collectives: no communication lane
    peak = next(x for x in texts if x.startswith("peak:"))
    assert f"step {st['peak_step']} {st['peak_span'].name} ({st['peak_span'].kind})" in peak
    assert f"sub-batch 1 of {plan.k}" in peak
    assert [x.strip() for x in texts if not x.startswith("peak:")] == [name for name, _, _ in trace.parts[1:]]
    reduction = Span("comm", "all-reduce bucket 0", "allreduce", -1, 0.0, trace.duration / 2, 1024)
    labels, _ = lanes_and_texts(Trace(**{**vars(trace), "spans": trace.spans + [reduction]}))
    assert labels == ["comm", "copy", "compute"]
