"""Runs that never collide (issue 31, items 6 and 9): ``minidnn train --out`` refuses a folder holding
another run unless told to continue (``--resume``) or replace it (``--overwrite``), locks the folder
while it trains, spares another live run's temporary files, survives a full disk under
``--trace-dir``, and names a missing dependency in one line at the start."""
import errno
import io
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from minidnn import trace as trace_module
from minidnn.checkpoint import save_checkpoint
from test_cli import one_line_error, run

LENET = ["--model", "lenet5", "--data", "synthetic:1x28x28:classes=10:n=32", "--epochs", "1", "--batch-size", "16",
         "--no-progress"]


def files_of(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_second_run_into_a_folder_holding_a_run_is_refused_and_changes_nothing(tmp_path, capsys):
    """Before: the second run overwrote the checkpoint and appended to the logs (two "epoch 1" lines)."""
    out = tmp_path / "run"
    rc, stdout, err = run(capsys, "train", *LENET, "--out", out)
    assert rc == 0, err
    assert stdout.splitlines()[0] == f"run folder: {out}"                       # at the start
    assert stdout.splitlines()[-1] == f"run folder: {out} (checkpoint.safetensors, steps.jsonl, metrics.jsonl)"
    first = files_of(out)
    rc, _, err = run(capsys, "train", *LENET, "--seed", "1", "--out", out)
    line = one_line_error(err)
    assert rc == 2 and str(out) in line and "holds a previous run" in line
    assert f"--resume {out / 'checkpoint.safetensors'}" in line and "--overwrite" in line
    assert files_of(out) == first


def test_overwrite_replaces_the_run_and_resume_continues_it_in_its_folder(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(capsys, "train", *LENET, "--out", out)[0] == 0
    rc, _, err = run(capsys, "train", *LENET, "--seed", "1", "--out", out, "--overwrite")
    assert rc == 0, err
    assert [m["epoch"] for m in jsonl(out / "metrics.jsonl")] == [1]           # one run's lines, not two
    assert len(jsonl(out / "steps.jsonl")) == 2
    rc, stdout, err = run(capsys, "train", "--resume", out / "checkpoint.safetensors", "--epochs", "2")
    assert rc == 0, err                                                        # its own folder, by default
    assert f"run folder: {out}" in stdout
    assert [m["epoch"] for m in jsonl(out / "metrics.jsonl")] == [1, 2]
    rc, _, err = run(capsys, "train", "--resume", out / "checkpoint.safetensors", "--epochs", "3", "--overwrite")
    assert rc == 2 and "--overwrite would delete" in one_line_error(err)
    other = tmp_path / "other"
    assert run(capsys, "train", *LENET, "--out", other)[0] == 0
    before = files_of(other)
    rc, _, err = run(capsys, "train", "--resume", out / "checkpoint.safetensors", "--epochs", "3", "--out", other)
    line = one_line_error(err)
    assert rc == 2 and f"--out {out}" in line                                  # where the resumed run belongs
    assert files_of(other) == before


def test_a_refused_overwrite_loses_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(capsys, "train", *LENET, "--out", out)[0] == 0
    before = files_of(out)
    rc, _, err = run(capsys, "train", *LENET, "--data", f"mnist:{tmp_path / 'none'}", "--out", out, "--overwrite")
    assert rc == 2 and "missing file" in one_line_error(err)
    assert files_of(out) == before


HOLD = textwrap.dedent("""
    import sys
    from minidnn.run_folder import RunFolder
    with RunFolder(sys.argv[1]) as folder:
        folder.claim()
        print("holding", flush=True)
        sys.stdin.read()
""")


def test_a_folder_in_use_is_refused_naming_the_pid_that_holds_it(tmp_path, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        rc, _, err = run(capsys, "train", *LENET, "--out", out)
        line = one_line_error(err)
        assert rc == 2 and str(out) in line and f"in use by another minidnn train (pid {holder.pid}" in line
        assert not (out / "checkpoint.safetensors").exists()
    finally:
        holder.kill()                     # killed, not ended: the kernel releases its lock all the same
        holder.wait()
    rc, _, err = run(capsys, "train", *LENET, "--out", out)
    assert rc == 0, err


def test_the_stale_temporary_file_cleanup_spares_a_live_writers_file(tmp_path):
    """Two runs writing one checkpoint path: the first's cleanup deleted the second's temporary file
    mid-write (the second died at epoch 17). Only files of writers that ended on this host go."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead, host = int(ended.stdout), socket.gethostname()
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        names = {"live": f".ckpt.safetensors.{live.pid}@{host}.a1b2c3d4.tmp",
                 "elsewhere": f".ckpt.safetensors.{dead}@not-{host}.e5f6g7h8.tmp",
                 "dead": f".ckpt.safetensors.{dead}@{host}.i9j0k1l2.tmp",
                 "old": ".ckpt.safetensors.k1ll3d.tmp"}                 # from a minidnn before writer names
        for name in names.values():
            (tmp_path / name).write_bytes(b"partial")
        save_checkpoint(tmp_path / "ckpt.safetensors", {}, {"i": 1})
        left = set(os.listdir(tmp_path))
        assert names["live"] in left and names["elsewhere"] in left
        assert names["dead"] not in left and names["old"] not in left
        assert "ckpt.safetensors" in left and len(left) == 3
    finally:
        live.kill()
        live.wait()


class FullDisk(io.StringIO):
    """A text file on a disk that fills after 1000 characters."""

    def write(self, text):
        if self.tell() + len(text) > 1000:
            super().write(text[:max(0, 1000 - self.tell())])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(text)


def test_trace_dir_on_a_full_disk_warns_trains_on_and_leaves_no_truncated_trace(tmp_path, capsys, monkeypatch):
    """Before: the write error ended the training at the traced step, and a truncated trace.json stayed."""
    real_open, partial = open, []

    def full_disk_open(path, mode="r", *args, **kwargs):
        if "w" in mode:
            real_open(path, mode, *args, **kwargs).write("{" * 1000)     # what reached the disk
            partial.append(path)
            return FullDisk()
        return real_open(path, mode, *args, **kwargs)
    monkeypatch.setattr(trace_module, "open", full_disk_open, raising=False)
    out, tdir = tmp_path / "run", tmp_path / "trace"
    rc, stdout, err = run(capsys, "train", *LENET, "--epochs", "2", "--trace-dir", tdir, "--trace-step", "2",
                          "--out", out)
    assert rc == 0, err
    assert partial, "the trace was not written through the full disk"
    assert "warning: the memory trace of step 2 was not written" in err and "No space left on device" in err
    assert [m["epoch"] for m in jsonl(out / "metrics.jsonl")] == [1, 2]       # trained to the end
    assert sorted(os.listdir(tdir)) == []                                      # no trace.json, no temporary file


def test_a_missing_dependency_is_one_line_at_the_start_naming_what_to_install(tmp_path, capsys, monkeypatch):
    """matplotlib missing (before: a ModuleNotFoundError traceback at the traced step, after training
    had started)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "run"
    rc, stdout, err = run(capsys, "train", *LENET, "--trace-dir", tmp_path / "trace", "--out", out)
    line = one_line_error(err)
    assert rc == 2 and "--trace-dir" in line and "pip install matplotlib" in line
    assert not out.exists() and stdout == ""                                   # before anything ran


def test_what_the_documented_options_need_is_a_base_dependency():
    """``pip install .`` alone gives --trace-dir (matplotlib) and imagefolder: (Pillow)."""
    import tomllib
    with open(os.path.join(os.path.dirname(__file__), os.pardir, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    base = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in project["dependencies"]}
    assert {"matplotlib", "pillow"} <= base


def test_an_image_size_beyond_the_memory_is_one_line(tmp_path, capsys):
    """--image-size 100000 (before: a MemoryError traceback)."""
    rc, _, err = run(capsys, "train", "--image-size", "100000", "--no-progress", "--out", tmp_path / "run")
    line = one_line_error(err)
    assert rc == 2 and "100000x100000" in line and "smaller image size" in line
    assert not (tmp_path / "run").exists()


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)           # a run without --out writes runs/latest here, not in the checkout
