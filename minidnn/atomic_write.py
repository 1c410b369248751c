"""Files that appear whole or not at all.

A file written in place and cut short (a full disk, a killed process) is a
truncated file under the final name, which a reader then fails on, or worse
reads. Written to a temporary sibling and renamed over the final name
(``os.replace``, atomic within a folder), it is the previous file or the new
one, whole. (Checkpoints do the same with an fsync in ``checkpoint.py``.)
"""
from __future__ import annotations

import contextlib
import os
import tempfile


@contextlib.contextmanager
def replacing(path):
    """``with replacing(path) as tmp:`` write ``tmp``; it becomes ``path`` if the block completes, else
    it is removed and ``path`` is left as it was. ``tmp`` ends in ``path``'s extension, for writers that
    choose a format by it (matplotlib's ``savefig``, gzip by ``.gz``)."""
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=f".tmp{os.path.splitext(name)[1]}")
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o644)          # mkstemp makes it 0600; the file is the user's like any other
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
