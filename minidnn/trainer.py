"""``minidnn.compile``: a network, a loss, an optimizer and a memory budget in; a Trainer out."""
from __future__ import annotations

import dataclasses
import os
import threading

import numpy as np

from .atomic_write import replacing
from .autograd import build_schedule
from .backend import get_backend
from .data import Normalization
from .errors import ConfigError, ShapeError
from .executor import Context, Executor
from .grad_scaler import GradScaler
from .graph import trace
from .memory import MemoryConfig
from .memory.subbatch import plan_eval, plan_step
from .persistent import PersistentStore
from .precision import get_precision
from .split_graph import step_splits
from .trace import Recorder
from .transaction import atomic_step

# The training dtypes the kernels of every backend take (CPU's C++ kernels, CUDA's).
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _training_dtype(dtype):
    """``dtype`` as a NumPy dtype, or ConfigError before anything is changed."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt not in DTYPES:        # (None == np.dtype("float64"): np.dtype(None) is float64)
        raise ConfigError(f"compile: dtype must be one of {', '.join(d.name for d in DTYPES)} (parameters and "
                          f"activations are trained in it), got {dtype!r}")
    return dt


class Trainer:
    """Trains ``net`` one step at a time under a memory plan made before the first step.

    Each input shape gets its own schedule and plan (the last partial batch, or
    ``predict`` in eval mode), cached by shape; all share the persistent region
    and one arena sized for the largest.
    """

    def __init__(self, net, input_shape, loss, optimizer, device="cpu", memory=None, dtype=np.float32, seed=0,
                 trace_every=1, parallel=None, normalize=None, precision="fp32"):
        dtype = _training_dtype(dtype)
        self.precision = get_precision(precision)
        if self.precision.mixed and dtype != np.float32:
            raise ConfigError(f"compile: precision {self.precision.name!r} keeps float32 master weights; "
                              f"give dtype=np.float32, got {dtype.name}")
        # the inputs' normalization belongs to the model: step and predict apply it, checkpoints keep it
        self.normalization = Normalization.of(normalize, input_shape[1] if len(input_shape) > 1 else None,
                                              "compile: normalize")
        # step and predict share the arena, the plans and the counters: one runs at a time (see step)
        self._running = threading.Lock()
        # Compiling points the network's arrays at the trainer's (cast, then moved into its persistent
        # region): a compile that fails leaves the network's arrays as they were.
        arrays = [(t, t.data, t.grad) for t in [*net.parameters(), *(b for _, b in net.named_buffers())]]
        try:
            self._compile(net, input_shape, loss, optimizer, device, memory, dtype, seed, trace_every, parallel)
        except BaseException:
            for t, data, grad in arrays:
                t.data, t.grad = data, grad
            raise

    def _compile(self, net, input_shape, loss, optimizer, device, memory, dtype, seed, trace_every, parallel):
        self.net, self.loss, self.optimizer = net, loss, optimizer
        # data-parallel: input_shape's batch is the global one; this rank compiles its slice
        self.input_shape = parallel.local_shape(input_shape) if parallel is not None else tuple(input_shape)
        self.dtype = np.dtype(dtype)
        self.memory = memory if isinstance(memory, MemoryConfig) else MemoryConfig(budget=memory)
        self.backend = get_backend(device)
        if self.precision.name != "fp32":
            self.backend.check_precision(self.precision)
        # fp16: dynamic loss scaling (GradScaler's rules); its state is checkpointed
        self.scaler = GradScaler() if self.precision.scaled and optimizer is not None else None
        self.rng = np.random.default_rng(seed)
        self.steps_done = 0
        for p in net.parameters():
            if p.data.dtype != self.dtype:
                p.data = p.data.astype(self.dtype)
        for name, b in net.named_buffers():
            if b.data.dtype.kind == "f" and b.data.dtype != self.dtype:
                b.data = b.data.astype(self.dtype)
        for name, p in net.named_parameters():
            p.qualname = name
        for name, b in net.named_buffers():
            b.qualname = name
        self._plans: dict = {}
        first = self._schedule(self.input_shape, training=True)
        self.store = PersistentStore(self.backend, first, optimizer)
        self.executor = Executor(self.backend, self.store, poison=self.memory.poison, check=self.memory.check)
        self.parallel = parallel.attach(self, first, tuple(input_shape)) if parallel is not None else None
        self.recorder = Recorder(every=trace_every, clock=self.backend.clock) if trace_every else None
        self.cost = None
        if self.memory.profile == "measured":          # a profiling pass on the running backend
            from .profiling import measure_costs
            rng = np.random.default_rng(0)
            feeds = [rng.standard_normal(self.input_shape).astype(self.dtype),
                     np.zeros(first.tensor(first.inputs[1]).spec.shape, first.tensor(first.inputs[1]).spec.dtype)]
            self.cost = measure_costs(self, first, feeds)
        plan = plan_step(first, self.memory, self._cost(None), self._splits(self.input_shape),
                         whole_cost=self._cost(self.cost) if self.cost is not None else None)
        # a fractional budget is a fraction of the compiled training step's liveness peak;
        # every other shape (the last partial batch, predict) gets the same bytes
        self.memory = dataclasses.replace(self.memory, budget=plan.budget)
        self._plans[("train", self.input_shape)] = plan

    # -- planning -----------------------------------------------------------
    def _schedule(self, shape, training):
        """Training steps trace the modules in the modes the user set (a frozen BatchNorm stays
        frozen); ``predict`` traces everything in eval mode."""
        if training:
            graph = trace(self.net, shape, self.dtype, loss=self.loss, precision=self.precision,
                          native=self.backend.native_ops)
        else:
            modes = [(m, m.training) for m in self.net.modules()]
            self.net.eval()
            try:
                graph = trace(self.net, shape, self.dtype, precision=self.precision, native=self.backend.native_ops)
            finally:
                for m, mode in modes:
                    object.__setattr__(m, "training", mode)
        return build_schedule(graph, training=training, optimizer=self.optimizer if training else None)

    def plan_for(self, shape, training=True):
        """The plan for a step on ``shape``: whole or split (see ``memory.subbatch``); in eval mode
        (``training=False``), whole or in chunks."""
        key = ("train" if training else "eval", tuple(shape))
        plan = self._plans.get(key)
        if plan is None:
            shape = tuple(shape)
            if training:
                plan = plan_step(self._schedule(shape, True), self.memory, self._cost(None), self._splits(shape))
            else:
                plan = plan_eval(shape[0], lambda b: self._schedule((b,) + shape[1:], False), self.memory,
                                 self._cost(None), held_bytes=self.store.nbytes)
            self._plans[key] = plan
        return plan

    def _splits(self, shape):
        """How a training step on ``shape`` is built as sub-batches (None: without an optimizer it is not)."""
        if self.optimizer is None:
            return None
        return step_splits(self.net, shape, self.loss, self.optimizer, self.dtype, self.precision,
                           self.backend.native_ops)

    def _cost(self, base):
        """The cost model plans use on this backend (on CUDA: cuDNN's algorithms and times)."""
        return self.backend.planning_cost(base, self.memory.profile)

    @property
    def plan(self):
        """The plan of a training step at the compiled input shape."""
        return self._plans[("train", self.input_shape)]

    # -- running ------------------------------------------------------------
    def _check_input(self, x):
        x = np.asarray(x)
        if x.ndim != len(self.input_shape) or x.shape[1:] != self.input_shape[1:]:
            raise ShapeError(f"step: expected input of shape (batch, {', '.join(map(str, self.input_shape[1:]))}),"
                             f" got {x.shape}")
        if x.dtype.kind not in "fiu":
            raise ShapeError(f"step: expected a numeric input, got dtype {x.dtype}")
        if x.shape[0] == 0 and self.parallel is None:   # a data-parallel rank's slice may be (see Replica)
            raise ShapeError(f"step: the batch is empty (input of shape {x.shape}); give at least one sample")
        return x

    def _normalized(self, x):
        return self.normalization.apply(x) if self.normalization is not None else x

    def _check_labels(self, plan, y):
        y = np.asarray(y)
        spec = plan.labels
        if y.shape != spec.shape:
            raise ShapeError(f"step: expected labels of shape {spec.shape}, got {y.shape}")
        if np.dtype(spec.dtype).kind in "iu":
            if y.dtype.kind not in "iu":
                raise ShapeError(f"step: expected integer class labels, got dtype {y.dtype}")
            classes = plan.classes
            if y.size and (y.min() < 0 or y.max() >= classes):
                raise ValueError(f"step: labels must be in [0, {classes}), got values in [{y.min()}, {y.max()}]")
        return y

    def step(self, x, y) -> float:
        """One training step on a batch; returns the loss.

        All or nothing (minidnn.transaction): on any exception the parameters, optimizer state,
        BatchNorm statistics, counters and random stream are those of before the step. Ctrl-C (as
        any signal handler's exception) is raised between two of its kernels before the update, or
        else once the step is done.
        The network's current arrays are trained, whichever trainer or assignment set them
        (see ``compile``).

        Thread-safe: calls from several threads (``step`` or ``predict``) run one at a time, in the
        order they take the trainer's lock, each as if called alone; they share one arena and one
        set of parameters, so side by side they would write each other's buffers."""
        with self._running:
            self.store.adopt()
            with atomic_step(self.store, self.rng) as txn:
                return self._step(x, y, txn)

    def _step(self, x, y, txn):
        x = self._normalized(self._check_input(x))
        n_local = x.shape[0]
        if self.parallel is not None:      # a rank without a sample of this batch runs a stand-in of no weight
            x, y = self.parallel.stand_in(x, np.asarray(y))
        plan = self.plan_for((x.shape[0],) + self.input_shape[1:])
        y = self._check_labels(plan, y)
        ctx = Context.on(self.backend, self.rng)
        t = self.steps_done + 1
        if self.scaler is not None:        # the loss's gradient seeded with the scale; skipped steps not counted
            ctx.scaling = self.scaler.begin()
            ctx.loss_scale = ctx.scaling.scale
            t -= self.scaler.skipped_steps
        if self.parallel is not None:
            self.parallel.begin(ctx, plan, n_local)
        loss = plan.run(self.executor, ctx, x, y, self.optimizer, t, self.recorder, txn)
        if self.parallel is not None:
            loss = self.parallel.end(ctx, loss)
        txn.commit()
        if self.scaler is not None:
            self.scaler.end(ctx.scaling)
        self.steps_done += 1
        for m in self.net.modules():
            nbt = getattr(m, "num_batches_tracked", None)
            if nbt is not None and m.training:
                nbt.data += plan.batch_norm_updates
        return loss

    def predict(self, x) -> np.ndarray:
        """The network's output for ``x`` in eval mode (a new array); waits for a ``step`` running in
        another thread, and the other way round."""
        x = self._normalized(self._check_input(x))
        with self._running:
            self.store.adopt()
            plan = self.plan_for((x.shape[0],) + self.input_shape[1:], training=False)
            with atomic_step() as txn:               # signals at safe points only
                return plan.run(self.executor, Context.on(self.backend, self.rng), x, txn=txn)

    @property
    def trace(self):
        """The memory timeline of the last recorded training step (a minidnn.trace.Trace), or None."""
        return self.recorder.trace if self.recorder is not None else None

    def save_trace(self, folder):
        """Write the last recorded training step's memory timeline into ``folder``: trace.json
        (Perfetto, chrome://tracing), memory.png, memory_snapshot.pickle (pytorch.org/memory_viz)
        and memory.csv, each file whole or not at all. Returns the paths written."""
        from .trace import plot, to_csv       # plot imports matplotlib: only when a trace is saved
        trace = self.trace
        if trace is None:
            raise ConfigError("save_trace: no training step has been recorded yet" +
                              (" (compiled with trace_every=0)" if self.recorder is None else ""))
        os.makedirs(folder, exist_ok=True)
        paths = {name: os.path.join(folder, name) for name in
                 ("trace.json", "memory.png", "memory_snapshot.pickle", "memory.csv")}
        trace.save(paths["trace.json"])
        for name, write in (("memory.png", lambda p: plot(trace, p)),
                            ("memory_snapshot.pickle", trace.save_memory_snapshot),
                            ("memory.csv", lambda p: to_csv(trace, p))):
            with replacing(paths[name]) as tmp:
                write(tmp)
        return list(paths.values())

    # -- accounting ---------------------------------------------------------
    @property
    def ideal_bytes(self):
        return self.plan.ideal_bytes

    @property
    def liveness_peak_bytes(self):
        return self.plan.liveness_peak_bytes

    @property
    def persistent_bytes(self):
        return self.store.nbytes

    @property
    def measured_peak_bytes(self):
        """Persistent region + the arena high-water mark the executor measured in its last run."""
        return self.store.nbytes + self.executor.high_water_bytes


def compile(net, input_shape, loss, optimizer=None, device="cpu", memory=None, dtype=np.float32, seed=0,
            trace_every=1, parallel=None, normalize=None, precision="fp32") -> Trainer:
    """Trace ``net`` with ``loss`` at ``input_shape`` (batch first), plan memory, and return a Trainer.

    ``memory`` is a :class:`MemoryConfig`, a budget (bytes, ``"512MiB"``, a
    fraction of the liveness peak) or None for no limit. ``seed`` seeds the
    trainer's own random stream (dropout), so seeded runs repeat bit for bit.
    Every ``trace_every``-th training step is recorded (``trainer.trace``; 0: none).
    ``dtype`` (float32 or float64) is the one parameters and activations are trained in; a
    compile that fails (any other dtype, a budget below the minimum) leaves ``net`` as it was.
    With ``parallel`` (a :class:`minidnn.distributed.DataParallel`), this process is one rank of
    data-parallel training: ``input_shape``'s batch is the global mini-batch, and ``step`` takes
    this rank's slice of it (``DataLoader(shard=parallel.shard_of)``).
    ``normalize=(mean, std)`` (per channel, or one value for all) normalizes every input of
    ``step`` and ``predict`` as ``(x - mean) / std``; ``trainer.normalization`` holds it and
    :func:`minidnn.save` keeps it, so a network loaded with :func:`minidnn.load` is fed as
    it was trained.
    ``precision`` ("fp32", "tf32", "bf16" or "fp16"; see :mod:`minidnn.precision`): under
    "bf16"/"fp16" the graph inserts torch.autocast's casts (fp32 master weights, low-precision
    activations and convolution/linear math with fp32 accumulation), "fp16" with GradScaler's
    dynamic loss scaling (``trainer.scaler``); ``plan.summary()`` names it.

    Several trainers may be compiled on one network: each trains the network's current
    weights (a trainer copies them in where another trainer, or an assignment to
    ``p.data``, replaced its arrays) and keeps its own optimizer state and step count,
    as two PyTorch optimizers over one model do.
    """
    return Trainer(net, input_shape, loss, optimizer, device, memory, dtype, seed, trace_every, parallel, normalize,
                   precision)
