"""The output folder of a ``minidnn train`` run (``--out``): one run at a time, another run's files never
touched by surprise.

A folder that holds a run's files (its checkpoint, step and epoch logs) is
refused, unless the new run continues that run (``--resume`` from the
folder's own checkpoint: the logs are rewritten from the checkpoint on) or
replaces it (``--overwrite``, whose files go once every check has passed, so
a refused run loses nothing). Written into, a second run would overwrite the
first's checkpoint and append to its logs.

A lock file is held for the whole run, so a second run started into the same
folder stops at once, naming the first one's pid. It is an ``flock``: the
kernel releases it when its process ends, however it ends, so a run killed
with ``kill -9`` leaves no stale lock behind.
"""
from __future__ import annotations

import contextlib
import fcntl
import os

from .errors import ConfigError

RUN_FILES = ("checkpoint.safetensors", "steps.jsonl", "metrics.jsonl")
LOCK = ".minidnn-train.lock"


class RunFolder:
    """``with RunFolder(out, metrics) as run: run.claim(resume, overwrite)``; the lock is released, and a
    folder the run created but left empty removed, when the block ends."""

    def __init__(self, path, metrics=None):
        self.path = os.fspath(path)
        self.files = [os.path.join(self.path, f) for f in RUN_FILES]
        if metrics and not any(os.path.abspath(metrics) == os.path.abspath(f) for f in self.files):
            self.files.append(os.fspath(metrics))        # --metrics elsewhere: this run's file too
        self._fd, self._created = None, False

    def __fspath__(self):
        return self.path

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def claim(self, resume=None, overwrite=False):
        """Lock the folder (creating it), then refuse it if it holds another run that ``resume`` (the path
        of the checkpoint the run continues, or None) does not continue and ``overwrite`` does not replace.
        ConfigError, in one line, naming the folder and the way on."""
        self._lock()
        previous = self.previous()
        own = resume is not None and self._holds(resume)
        if own and overwrite:
            raise ConfigError(f"--overwrite would delete {resume}, the checkpoint --resume continues from: "
                              "give one of them")
        if previous and not own and not overwrite:
            names = ", ".join(os.path.relpath(f, self.path) for f in previous)
            ckpt = os.path.join(self.path, RUN_FILES[0])
            ways = ([f"continue it with --resume {ckpt}"] if os.path.isfile(ckpt) and resume is None else
                    [f"continue the run of {resume} in its own folder (--out {os.path.dirname(resume) or '.'})"]
                    if resume is not None else []) + ["replace it with --overwrite", "or give another --out"]
            raise ConfigError(f"--out {self.path} holds a previous run ({names}): {', '.join(ways)}")

    def previous(self):
        """The files of a run already in the folder."""
        return [f for f in self.files if os.path.lexists(f)]

    def clear(self):
        """Remove the previous run's files (``--overwrite``), once nothing else can refuse the run."""
        for f in self.previous():
            os.unlink(f)

    def _holds(self, checkpoint):
        """Whether ``checkpoint`` is this folder's own checkpoint."""
        mine = os.path.join(self.path, RUN_FILES[0])
        return os.path.exists(mine) and os.path.exists(checkpoint) and os.path.samefile(mine, checkpoint)

    def _lock(self):
        if not os.path.isdir(self.path):
            os.makedirs(self.path)
            self._created = True
        lock = os.path.join(self.path, LOCK)
        while True:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "not yet written"
                os.close(fd)
                raise ConfigError(f"--out {self.path} is in use by another minidnn train (pid {holder}; its lock "
                                  f"is {lock}): wait for it to end, or give another --out") from None
            # A run ending removes its lock file: locked after that, ours would be a file no one else sees.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self):
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.path, LOCK))     # while still locked: see _lock
            os.close(self._fd)
            self._fd = None
        if self._created:
            with contextlib.suppress(OSError):               # only if empty: the run wrote nothing
                os.rmdir(self.path)
            self._created = False
