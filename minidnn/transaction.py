"""A training step is all or nothing.

Ctrl-C is held for the whole of a step (SIGINT's handler records the signal)
and raised at safe points only: between two steps of the program, before the
commit point. An interrupt landing anywhere else, in a lane's wait, a copy's
wait, a lock's bookkeeping or halfway through an in-place update, would leave
a thread writing into an abandoned step's buffers, a primitive half-released,
or parameters half-updated; held, it waits for the next safe point instead.

Before its first optimizer update a step changes only the network's buffers
(BatchNorm's running statistics, which its forwards move) and the trainer's
random stream (dropout): both are saved when the step starts and put back if
anything raises before the update. The first update is the commit point: from
there to the end of the step (the updates, the step counter,
``num_batches_tracked``) nothing is raised on purpose, and the updates are
arithmetic into buffers allocated before the step, so an interrupt held there
is raised once the step is done, leaving the state of after it.

Saving costs one copy of the buffers, which the persistent region keeps side
by side (6 KiB for ResNet-20), two handler swaps per step and one check per
program step (``scripts/bench_atomic_step.py``).
"""
from __future__ import annotations

import contextlib
import signal
import threading


class InterruptGuard:
    """Holds SIGINT from :meth:`hold` until :meth:`release`; :meth:`deliver` makes the held handler
    calls (the default handler raises KeyboardInterrupt) while still holding later ones.

    Signal handlers run only in the main thread, and only a Python handler can be held; elsewhere
    holding does nothing.
    """

    def __init__(self):
        self.held = False
        self.pending = []
        self._previous = None

    def hold(self):
        if self.held or threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGINT)
        if not callable(previous):
            return
        self._previous, self.held = previous, True
        signal.signal(signal.SIGINT, self._record)

    def _record(self, signum, frame):
        self.pending.append((signum, frame))

    def deliver(self):
        pending, self.pending = self.pending, []
        for signum, frame in pending:      # a second Ctrl-C is a second call (the training loop's forces a stop)
            self._previous(signum, frame)

    def release(self):
        if not self.held:
            return
        signal.signal(signal.SIGINT, self._previous)
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
    guard.hold()
    try:
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
