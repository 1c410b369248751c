"""A training step is all or nothing.

Signals are held for the whole of a step (each Python handler's call is
recorded) and delivered at safe points only: between two steps of the program,
before the commit point. That covers Ctrl-C (SIGINT's handler raises
KeyboardInterrupt) and every other handler that raises, as test harnesses and
notebooks install them (a SIGALRM timeout). An exception landing anywhere else,
in a lane's wait, a copy's wait, a lock's bookkeeping or halfway through an
in-place update, would leave a thread writing into an abandoned step's buffers,
a primitive half-released, or parameters half-updated; held, it waits for the
next safe point instead. (An exception that comes another way, raised while the
lanes run, still waits for them: backend/lanes.py.)

Before its first optimizer update a step changes only the network's buffers
(BatchNorm's running statistics, which its forwards move) and the trainer's
random stream (dropout): both are saved when the step starts and put back if
anything raises before the update. The first update is the commit point: from
there to the end of the step (the updates, the step counter,
``num_batches_tracked``) nothing is raised on purpose, and the updates are
arithmetic into buffers allocated before the step, so a signal held there
is delivered once the step is done, leaving the state of after it.

Saving costs one copy of the buffers, which the persistent region keeps side
by side (6 KiB for ResNet-20), a look at each signal's handler and two handler
swaps per step (only SIGINT has a Python handler unless one was installed) and
one check per program step (``scripts/bench_atomic_step.py``).
"""
from __future__ import annotations

import contextlib
import signal
import threading


# The signals a Python handler may be installed for (listing them converts each to an enum: once).
SIGNALS = tuple(sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}))


class InterruptGuard:
    """Holds every signal that has a Python handler from :meth:`hold` until :meth:`release`;
    :meth:`deliver` makes the held handler calls (SIGINT's default handler raises KeyboardInterrupt,
    a harness's SIGALRM handler may raise anything) while still holding later ones.

    Signal handlers run only in the main thread, and only a Python handler can be held; elsewhere
    holding does nothing.
    """

    def __init__(self):
        self.held = False
        self.pending = []
        self._previous = {}                 # signal -> the handler it had, for those held

    def hold(self):
        if self.held or threading.current_thread() is not threading.main_thread():
            return
        self.held, self._previous = True, {}   # before the first swap: release undoes a hold cut short
        for signum in SIGNALS:
            previous = signal.getsignal(signum)
            if callable(previous):
                self._previous[signum] = previous
                signal.signal(signum, self._record)

    def _record(self, signum, frame):
        self.pending.append((signum, frame))

    def deliver(self):
        pending, self.pending = self.pending, []
        for signum, frame in pending:      # a second Ctrl-C is a second call (the training loop's forces a stop)
            self._previous[signum](signum, frame)

    def release(self):
        if not self.held:
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self.held = False
        self.deliver()

    def __enter__(self):
        self.hold()
        return self

    def __exit__(self, *exc):
        self.release()


class Step:
    """What the executor sees of a step's transaction: safe points and the commit point."""

    def __init__(self, guard):
        self.guard, self.committed = guard, False

    def poll(self):
        """A safe point: raise a held interrupt here, unless the step is committed."""
        if self.guard.pending and not self.committed:
            self.guard.deliver()

    def commit(self):
        """From here on the step completes; a held interrupt is raised after it."""
        self.committed = True


@contextlib.contextmanager
def atomic_step(store=None, rng=None):
    """``with atomic_step(trainer.store, trainer.rng) as step:`` one step, which polls ``step`` at its
    safe points and calls ``step.commit()`` before it changes parameters, optimizer state or counters.
    An exception before that restores the buffers and ``rng``. Without a store (``predict``) only the
    interrupt discipline applies."""
    guard = InterruptGuard()
    try:
        guard.hold()
        saved = store.save_buffers() if store is not None else None
        rng_state = rng.bit_generator.state if rng is not None else None
        step = Step(guard)
        try:
            yield step
        except BaseException:
            if not step.committed:
                if saved is not None:
                    store.restore_buffers(saved)
                if rng_state is not None:
                    rng.bit_generator.state = rng_state
            raise
    finally:
        guard.release()
