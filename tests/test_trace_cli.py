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
