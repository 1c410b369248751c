"""`minidnn train --trace-dir` and `minidnn trace`: a real budgeted run, read back."""
import json
import os

from minidnn import cli
from minidnn.trace import load, problems, stats


def test_train_writes_a_trace_that_the_reader_accepts(tmp_path, capsys):
    out, tdir = tmp_path / "run", tmp_path / "trace"
    code = cli.main(["train", "--model", "resnet20", "--data", "synthetic:3x32x32:classes=10:n=48", "--epochs", "1",
                     "--batch-size", "16", "--budget", "0.5", "--trace-dir", str(tdir), "--trace-step", "2",
                     "--no-progress", "--out", str(out)])
    assert code == 0
    for name in ("trace.json", "memory.png", "memory_snapshot.pickle", "memory.csv"):
        assert (tdir / name).stat().st_size > 0
    trace = load(str(tdir / "trace.json"))
    assert problems(trace) == []                       # events replay to the executor's own peak
    assert trace.measured_peak == trace.plan_peak <= trace.budget
    st = stats(trace)
    assert st["prefetches_in_backward"] >= 1           # the 50% budget needs evictions
    with open(tdir / "trace.json") as f:
        assert "traceEvents" in json.load(f)           # Perfetto reads the same file
    capsys.readouterr()
    assert cli.main(["trace", "summary", str(tdir / "trace.json")]) == 0
    assert "measured = plan" in capsys.readouterr().out
    png = tmp_path / "again.png"
    assert cli.main(["trace", "plot", str(tdir / "trace.json"), "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["trace", "diff", str(tdir / "trace.json"), str(tdir / "trace.json")]) == 0


def test_a_truncated_trace_is_refused_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "cut.json"
    bad.write_text('{"traceEvents": [')
    assert cli.main(["trace", "summary", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and err.count("\n") == 1
    foreign = tmp_path / "other.json"
    foreign.write_text(json.dumps({"hello": 1}))
    assert cli.main(["trace", "plot", str(foreign)]) == 2
    assert os.path.basename(str(foreign)) in capsys.readouterr().err


def summary_of(trace, tmp_path, capsys):
    path = tmp_path / "t.json"
    trace.save(path)
    capsys.readouterr()
    assert cli.main(["trace", "summary", str(path)]) == 0
    return capsys.readouterr().out


def test_summary_computes_the_agreement_from_the_events_in_the_file(tmp_path, capsys):
    from dataclasses import replace

    from test_trace import fake_trace
    whole = fake_trace()
    assert "measured = plan" in summary_of(whole, tmp_path, capsys) and "INCOMPLETE" not in summary_of(
        whole, tmp_path, capsys)
    half = replace(whole, mem_events=whole.mem_events[:len(whole.mem_events) // 2])   # the stated peaks kept
    out = summary_of(half, tmp_path, capsys)
    assert "measured = plan" not in out and "but the trace is incomplete" in out
    assert "INCOMPLETE  3 buffers are allocated and never freed (e.g. input)" in out
    peak = [e for e in whole.mem_events if e.tensor == "conv1:conv2d" and e.offset == 4096]     # the prefetch
    lower = replace(whole, mem_events=[e for e in whole.mem_events if e not in peak])
    out = summary_of(lower, tmp_path, capsys)
    assert "the events' peak 16.00 KiB differs by -2048 B" in out
    assert "the file states a measured peak of 18432 B; its events reach 16384 B" in out
    no_spans = replace(whole, spans=[s for s in whole.spans if s.step != 2])
    assert "1 of 8 program steps have no span (e.g. step 2)" in summary_of(no_spans, tmp_path, capsys)


def test_a_trace_edited_after_it_was_written_is_refused(tmp_path, capsys):
    from test_trace import fake_trace
    path = tmp_path / "t.json"
    fake_trace().save(path)
    doc = json.loads(path.read_text())
    doc["minidnn"]["mem_events"] = doc["minidnn"]["mem_events"][:8]
    path.write_text(json.dumps(doc))
    assert cli.main(["trace", "summary", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "does not match its checksum" in err and err.count("\n") == 1
