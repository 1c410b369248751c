"""The CUDA backend's parts that run anywhere (the cuDNN binding's loading, versions, errors and
descriptor types; why the backend is unavailable; which precisions it refuses; ``minidnn info``; the
planner with a stand-in for cuDNN, fp32, staged and 16-bit) and, on a GPU, cuDNN's algorithms reaching
the planner and mixed precision (bf16, fp16): every op the backend runs natively in a 2-byte type
against its own fp32 result, and training steps against the CPU backend's.

Ops, gradients and memory plans run on CUDA through the ``device`` fixture of the other tests.
"""
import importlib
import sys

import numpy as np
import pytest

import minidnn as mdn
from conftest import cuda_unavailable_reason
from harness import host
from minidnn import nn, optim
from minidnn.backend import get_backend
from minidnn.backend.cuda import loader

needs_gpu = pytest.mark.skipif(cuda_unavailable_reason() is not None, reason=cuda_unavailable_reason() or "")


def binding_or_skip():
    try:
        return loader.load_binding()
    except ImportError as e:
        pytest.skip(f"the cuDNN binding is not available here: {e}")


# -- the binding, without a GPU ---------------------------------------------------------------------

def test_binding_reports_the_loaded_cudnn_version():
    b = binding_or_skip()
    v, built = b.version(), b.header_version()
    assert v >= 8000 and built >= 8000
    assert v // 10000 == built // 10000 if built >= 10000 else v // 1000 == built // 1000   # same major
    assert b.cudart_version() > 0


def test_binding_names_cudnns_algorithms():
    b = binding_or_skip()
    assert b.FWD_ALGOS[:2] == ["IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM"] and len(b.FWD_ALGOS) == 8
    assert len(b.BWD_DATA_ALGOS) == 6 and len(b.BWD_FILTER_ALGOS) == 7
    assert "WINOGRAD_NONFUSED" in b.BWD_FILTER_ALGOS


def test_cudnn_failures_raise_with_cudnns_status_string():
    b = binding_or_skip()
    assert b.error_string(b.STATUS_SUCCESS) == "CUDNN_STATUS_SUCCESS"
    b.check_status(b.STATUS_SUCCESS, "nothing")             # success raises nothing
    with pytest.raises(b.CudnnError) as e:
        b.check_status(b.STATUS_BAD_PARAM, "cudnnSomething(x)")
    assert isinstance(e.value, RuntimeError)
    assert "CUDNN_STATUS_BAD_PARAM" in str(e.value) and "cudnnSomething(x)" in str(e.value)
    assert e.value.status == b.STATUS_BAD_PARAM


def test_a_handle_without_a_gpu_is_a_python_error():
    b = binding_or_skip()
    if cuda_unavailable_reason() is None:
        pytest.skip("a GPU is present: a handle is created")
    with pytest.raises(b.CudnnError, match="cudnnCreate"):
        b.Handle(0)


def test_descriptor_rejects_an_unknown_dtype():
    b = binding_or_skip()
    with pytest.raises(TypeError, match="int8"):
        b.Conv(1, 1, 4, 4, 1, 3, 3, 1, 1, 0, 0, 1, 1, 1, "int8")


def test_16_bit_descriptors_hold_cudnns_16_bit_types_float_compute_and_tensor_op_math():
    """Read back from cuDNN (no GPU needed): bf16/fp16 data and filters, FLOAT accumulation and tensor-op
    math whatever TF32 says; float32 keeps FMA unless TF32 is allowed; float64 accumulates in double."""
    b = binding_or_skip()
    geom = (2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1)
    for dtype, data in (("bfloat16", b.DATA_BFLOAT16), ("float16", b.DATA_HALF)):
        for tf32 in (False, True):
            assert b.Conv(*geom, dtype, tf32).types == (data, data, data, b.DATA_FLOAT, b.TENSOR_OP_MATH), dtype
    f = b.DATA_FLOAT
    assert b.Conv(*geom, "float32", False).types == (f, f, f, f, b.FMA_MATH)
    assert b.Conv(*geom, "float32", True).types == (f, f, f, f, b.DEFAULT_MATH)
    d = b.DATA_DOUBLE
    assert b.Conv(*geom, "float64", False).types == (d, d, d, d, b.FMA_MATH)
    assert b.Conv(*geom, "bfloat16", False).output_shape == [2, 4, 8, 8]


# -- availability, without a GPU ----------------------------------------------------------------------

def _net():
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 6 * 6, 3)).init_parameters(0)


def test_unavailable_cuda_backend_says_why():
    reason = cuda_unavailable_reason()
    if reason is None:
        pytest.skip("the cuda backend is available here")
    with pytest.raises(mdn.BackendUnavailable) as e:
        mdn.compile(_net(), (2, 1, 8, 8), nn.CrossEntropyLoss(), device="cuda")
    msg = str(e.value)
    assert msg.startswith("the cuda backend cannot run here: ")
    for problem in loader.status().problems:
        assert problem in msg


def test_missing_cupy_is_named_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)            # `import cupy` raises ImportError
    s = loader.status()
    assert not s.available and s.cupy_version is None
    assert any("cupy does not import" in p and "minidnn[cuda]" in p for p in s.problems)
    with pytest.raises(mdn.BackendUnavailable, match="cupy does not import"):
        get_backend("cuda")


def test_unbuilt_binding_is_named(monkeypatch):
    real = importlib.import_module

    def fake(name, *a, **kw):
        if name == "minidnn._cudnn":
            raise ModuleNotFoundError("No module named 'minidnn._cudnn'")
        return real(name, *a, **kw)

    monkeypatch.setattr(loader.importlib, "import_module", fake)
    s = loader.status()
    assert s.binding is None and s.cudnn_version is None
    assert any("minidnn._cudnn was not built" in p for p in s.problems)
    assert "  cuDNN binding: not available" in s.lines()


def test_cuda_precisions_and_what_is_refused_in_one_line():
    """fp32, tf32 and fp16 run on every supported GPU; bf16 needs bfloat16 tensor cores (sm_80) and CuPy's
    bfloat16 arrays (CuPy 14), and a refusal names what to use instead."""
    from minidnn.backend.cuda.precision import check_precision
    from minidnn.precision import get_precision
    for name in ("fp32", "tf32", "bf16", "fp16"):
        check_precision(get_precision(name), 90, 14)
        check_precision(get_precision(name), 80, 14)
    for name in ("fp32", "tf32", "fp16"):
        check_precision(get_precision(name), 75, 13)
    with pytest.raises(mdn.BackendUnavailable, match=r"sm_75.*precision='fp16'.*device='cpu'") as e:
        check_precision(get_precision("bf16"), 75, 14)
    assert "\n" not in str(e.value)
    with pytest.raises(mdn.BackendUnavailable, match=r"CuPy 13 has no bfloat16.*cupy-cuda13x>=14"):
        check_precision(get_precision("bf16"), 90, 13)


def test_unknown_device_is_a_value_error():
    with pytest.raises(ValueError, match="'tpu'"):
        get_backend("tpu")


def test_info_reports_cuda_cudnn_and_cupy(capsys):
    from minidnn.cli import main
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    s = loader.status()
    assert f"cuda backend: {'available' if s.available else 'not available'}" in out
    for p in s.problems:
        assert f"problem: {p}" in out
    assert ("cupy: " + (s.cupy_version or "not installed")) in out
    if s.binding:
        assert f"cuDNN binding: {s.binding}" in out and "cuDNN library: " in out


def test_pareto_pairs_keep_only_pairs_nothing_beats():
    conv = pytest.importorskip("minidnn.backend.cuda.conv", reason="CuPy is not installed")
    data = {"ALGO_0": (0, 3.0), "ALGO_1": (100, 1.0)}
    filt = {"ALGO_0": (0, 2.0), "ALGO_1": (50, 1.0), "FFT": (500, 5.0)}
    front = conv._pareto_pairs(data, filt)
    # ALGO_1/ALGO_0 (3 s, 100 B) loses to ALGO_1/ALGO_1 (2 s, 100 B); FFT pairs are slow and large
    assert [p[0] for p in front] == ["ALGO_1/ALGO_1", "ALGO_0/ALGO_1", "ALGO_0/ALGO_0"]
    assert front[0] == ("ALGO_1/ALGO_1", 100, 2.0)
    assert all(a[2] <= b[2] and a[1] > b[1] for a, b in zip(front, front[1:]))


def test_every_not_supported_sub_code_is_an_unsupported_algorithm():
    """cuDNN 9's hierarchical NOT_SUPPORTED codes (3001-3014: shape, arch mismatch, shared memory, ...)
    mean "no workspace for this algorithm", not an error that stops planning."""
    b = binding_or_skip()
    assert b.workspace_result(b.STATUS_SUCCESS, 123) == 123
    for status in [b.STATUS_NOT_SUPPORTED] + list(range(3001, 3015)):
        assert b.is_not_supported(status), status
        assert b.workspace_result(status, 99) is None, status
    assert not b.is_not_supported(b.STATUS_BAD_PARAM) and not b.is_not_supported(b.STATUS_SUCCESS)
    with pytest.raises(b.CudnnError, match="CUDNN_STATUS_BAD_PARAM"):
        b.workspace_result(b.STATUS_BAD_PARAM, 99)


def test_find_keeps_each_algorithms_fastest_math_variant():
    """Find lists an algorithm once per math type (recorded from cuDNN 9 with TF32 allowed): each name
    keeps its fastest variant's time, workspace and math type, not the last one listed."""
    conv = pytest.importorskip("minidnn.backend.cuda.conv", reason="CuPy is not installed")
    # (algo, status, seconds, workspace, deterministic, tensor ops, math type), as Find returns them
    recorded = [(1, 0, 0.8e-3, 4 << 20, True, True, 1), (6, 0, 0.9e-3, 8 << 20, True, True, 1),
                (1, 0, 1.5e-3, 2 << 20, True, False, 0), (0, 0, 2.0e-3, 0, True, False, 0),
                (6, 0, 2.5e-3, 12 << 20, True, False, 0)]
    got = conv.fastest_variants(recorded, _FakeCudnn.FWD_ALGOS)
    assert got == {"IMPLICIT_PRECOMP_GEMM": (4 << 20, 0.8e-3, 1), "WINOGRAD": (8 << 20, 0.9e-3, 1),
                   "IMPLICIT_GEMM": (0, 2.0e-3, 0)}
    assert conv.fastest_variants(list(reversed(recorded)), _FakeCudnn.FWD_ALGOS) == got   # order-free


# -- on a GPU -------------------------------------------------------------------------------------------

@needs_gpu
def test_plans_on_cuda_choose_among_cudnns_algorithms():
    backend = get_backend("cuda")
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.Flatten(),
                        nn.Linear(8 * 16 * 16, 10)).init_parameters(0)
    trainer = mdn.compile(net, (4, 3, 16, 16), nn.CrossEntropyLoss(), optim.SGD(lr=0.1), device=backend)
    cudnn = backend.cudnn
    convs = [s for s in trainer.plan.steps if s.node is not None and s.node.op.name == "conv2d"
             and s.kind in ("forward", "backward")]
    assert convs
    for s in convs:
        assert s.algo is not None
        halves = [s.algo] if s.kind == "forward" else s.algo.split("/")
        names = [cudnn.FWD_ALGOS] if s.kind == "forward" else [cudnn.BWD_DATA_ALGOS, cudnn.BWD_FILTER_ALGOS]
        assert all(h in n for h, n in zip(halves, names)), s.algo
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 3, 16, 16)).astype(np.float32), rng.integers(0, 10, 4)
    losses = [trainer.step(x, y) for _ in range(5)]
    assert losses[-1] < losses[0]
    assert trainer.measured_peak_bytes == trainer.plan.peak_bytes


@needs_gpu
def test_cudnn_algorithms_have_workspaces_and_measured_times():
    from minidnn.graph import Spec
    from minidnn.ops.conv import Conv2dOp
    from minidnn.ops.conv_algos import Geom
    backend = get_backend("cuda")
    op = Conv2dOp(padding=1)
    ins, outs = [Spec((8, 16, 32, 32), np.float32), Spec((32, 16, 3, 3), np.float32)], \
        [Spec((8, 32, 32, 32), np.float32)]
    geom = Geom.of(op, ins[0], ins[1], outs[0])
    for pass_ in ("forward", "backward"):
        timed = backend.conv.timed(geom, pass_)
        assert timed
        secs = [t for _, t in timed.values()]
        assert secs == sorted(secs) and secs[0] > 0
        assert all(a.workspace >= 0 for a, _ in timed.values())


@needs_gpu
def test_conv_forward_with_every_algorithm_agrees_in_float64():
    from minidnn.executor import Context
    from minidnn.graph import Spec
    from minidnn.ops.conv import Conv2dOp
    backend = get_backend("cuda")
    xp = backend.xp
    op = Conv2dOp(stride=1, padding=1)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 3, 9, 9)), rng.standard_normal((4, 3, 3, 3))
    ins, outs = [Spec(x.shape, np.float64), Spec(w.shape, np.float64)], [Spec((2, 4, 9, 9), np.float64)]
    cpu = get_backend("cpu")
    want = np.empty((2, 4, 9, 9))
    op.forward(Context.on(cpu, rng), [x, w], [want], cpu.empty(op.workspace(ins, outs)))
    for algo in backend.conv.algorithms(op, ins, outs, "forward"):
        got = xp.empty((2, 4, 9, 9))
        ctx = Context.on(backend, rng)
        ctx.algo = algo.name
        with backend.compute_scope():
            op.forward(ctx, [xp.asarray(x), xp.asarray(w)], [got], backend.empty(algo.workspace))
        np.testing.assert_allclose(host(got), want, rtol=1e-10, atol=1e-12, err_msg=algo.name)


# -- the planner with a device's own algorithms (a stand-in for cuDNN: no GPU needed) ----------------

class _FakeConv:
    """Two forward and two backward "cuDNN" algorithms per layer: fast with a large workspace, slow
    with none; times from a table, as Find would measure them."""

    def __init__(self):
        from minidnn.ops.base import Algo
        self.lists = {"forward": [(Algo("FAST", 1 << 20, 1.0), 1e-3), (Algo("SMALL", 0, 3.0), 3e-3)],
                      "backward": [(Algo("ALGO_1/ALGO_1", 2 << 20, 1.0), 2e-3), (Algo("ALGO_0/ALGO_0", 0, 4.0), 8e-3)]}

    def algorithms(self, op, ins, outs, pass_):
        return [a for a, _ in self.lists[pass_]]

    def seconds(self, op, ins, outs, pass_, name):
        return dict((a.name, t) for a, t in self.lists[pass_])[name]


def test_the_planner_takes_a_devices_algorithms_and_times():
    from types import SimpleNamespace

    from minidnn.autograd import build_schedule
    from minidnn.backend.cuda.cost import DeviceCost
    from minidnn.graph import trace
    from minidnn.memory import MemoryConfig, plan_memory
    from minidnn.memory.costmodel import ProfileCost
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.Flatten(),
                        nn.Linear(8 * 8 * 8, 10)).init_parameters(0)
    sched = build_schedule(trace(net, (4, 3, 8, 8), loss=nn.CrossEntropyLoss()), optimizer=optim.SGD(lr=0.1))
    cost = DeviceCost(ProfileCost("h200-141gb"), SimpleNamespace(conv=_FakeConv()))
    convs = [s for s in sched.steps if s.node is not None and s.node.op.name == "conv2d"
             and s.kind in ("forward", "backward")]
    assert {cost.step_seconds(sched, s, _FakeConv().lists[s.kind][1][0]) for s in convs} == {3e-3, 8e-3}
    free = plan_memory(sched, MemoryConfig(), cost)
    assert {free.algos[s.index].name for s in convs} == {"FAST", "ALGO_1/ALGO_1"}     # the fastest, unlimited
    tight = plan_memory(sched, MemoryConfig(budget=free.peak_bytes - (1 << 20)), cost)
    assert tight.peak_bytes <= tight.budget
    assert any(tight.algos[s.index].workspace < free.algos[s.index].workspace for s in convs)


class _OneOptionConv(_FakeConv):
    """cuDNN with one usable algorithm per pass (as Find leaves for many layers under ``deterministic``),
    with a workspace far below the CPU default's im2col."""

    def __init__(self):
        from minidnn.ops.base import Algo
        self.lists = {"forward": [(Algo("IMPLICIT_GEMM", 256, 1.0), 1e-3)],
                      "backward": [(Algo("ALGO_1/ALGO_1", 512, 1.0), 2e-3)]}


def _planned_convs(conv, config):
    from types import SimpleNamespace

    from minidnn.autograd import build_schedule
    from minidnn.backend.cuda.cost import DeviceCost
    from minidnn.graph import trace
    from minidnn.memory import plan_memory
    from minidnn.memory.costmodel import ProfileCost
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.Flatten(),
                        nn.Linear(16 * 8 * 8, 10)).init_parameters(0)
    sched = build_schedule(trace(net, (8, 3, 8, 8), loss=nn.CrossEntropyLoss()), optimizer=optim.SGD(lr=0.1))
    plan = plan_memory(sched, config, DeviceCost(ProfileCost("h200-141gb"), SimpleNamespace(conv=conv)))
    convs = [s for s in sched.steps if s.node is not None and s.node.op.name == "conv2d"
             and s.kind in ("forward", "backward")]
    assert convs and all(sched.tensors[s.ws].nbytes > 4096 for s in convs)     # the CPU's im2col workspaces
    return plan, convs


def _workspaces(plan):
    """The workspace bytes of each conv step the program runs, by algorithm name."""
    prog = plan.program
    return {(s.algo, prog.tensors[s.ws].nbytes if s.ws is not None else 0) for s in prog.steps
            if s.node is not None and s.node.op.name == "conv2d" and s.kind in ("forward", "backward")}


def test_a_step_with_one_device_algorithm_runs_it_with_its_own_workspace():
    """One cuDNN option is still cuDNN's: the plan names it and charges its workspace, not im2col's."""
    from minidnn.memory import MemoryConfig
    plan, convs = _planned_convs(_OneOptionConv(), MemoryConfig())
    assert {plan.algos[s.index].name for s in convs} == {"IMPLICIT_GEMM", "ALGO_1/ALGO_1"}
    assert _workspaces(plan) == {("IMPLICIT_GEMM", 256), ("ALGO_1/ALGO_1", 512)}


def test_default_algorithms_on_a_device_are_its_first_and_never_traded():
    """``algorithms="default"`` pins the device's first-listed algorithm with its workspace under
    every budget (cuDNN runs by name, not the CPU default's im2col workspace)."""
    from minidnn.memory import MemoryConfig
    free, convs = _planned_convs(_FakeConv(), MemoryConfig(algorithms="default"))
    assert {free.algos[s.index].name for s in convs} == {"FAST", "ALGO_1/ALGO_1"}
    assert _workspaces(free) == {("FAST", 1 << 20), ("ALGO_1/ALGO_1", 2 << 20)}
    with pytest.raises(mdn.MemoryBudgetError) as e:                 # the least it needs: no algorithm traded
        _planned_convs(_FakeConv(), MemoryConfig(algorithms="default", budget=4096))
    tight, _ = _planned_convs(_FakeConv(), MemoryConfig(algorithms="default", budget=e.value.minimum_bytes))
    assert tight.peak_bytes <= tight.budget < free.peak_bytes
    assert {s.index: tight.algos[s.index].name for s in convs} == {s.index: free.algos[s.index].name for s in convs}


class _DeviceArray:
    """Stands in for a CuPy array: only ``get()`` gives its data to the host."""

    def __init__(self, a):
        self._a, self.shape, self.dtype = np.array(a), np.shape(a), np.asarray(a).dtype

    def get(self):
        return self._a.copy()

    def __array__(self, *a, **kw):
        raise TypeError("implicit conversion to a NumPy array is not allowed")


def test_state_dicts_and_checkpoints_copy_device_arrays_to_the_host(tmp_path):
    from minidnn.backend import to_numpy
    from minidnn.checkpoint import load_state_dict_file, save_checkpoint
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(to_numpy(_DeviceArray(a)), a)
    lin = nn.Linear(3, 2).init_parameters(0)
    lin.load_state_dict({"weight": _DeviceArray(a), "bias": _DeviceArray(np.ones(2, np.float32))})
    assert np.array_equal(lin.weight.data, a) and np.array_equal(lin.bias.data, np.ones(2))
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, {"weight": _DeviceArray(a)}, {})
    assert np.array_equal(load_state_dict_file(path)["weight"], a)


class _FakeCudnn:
    """The parts of minidnn._cudnn that CudnnConv's algorithm lists use, without a GPU."""

    STATUS_SUCCESS = 0
    FWD_ALGOS = ["IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING", "WINOGRAD",
                 "WINOGRAD_NONFUSED"]
    BWD_DATA_ALGOS = ["ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"]
    BWD_FILTER_ALGOS = ["ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"]

    class Conv:
        def __init__(self, n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups, dtype, tf32):
            self.output_shape = [n, o, (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1,
                                 (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1]

        def forward_workspace(self, handle, algo, math=-1):
            return 1000 * algo

        backward_data_workspace = backward_filter_workspace = forward_workspace

    @staticmethod
    def version():
        return 91000


def test_find_times_are_cached_on_disk_so_every_trainer_plans_the_same(tmp_path):
    conv_mod = pytest.importorskip("minidnn.backend.cuda.conv", reason="CuPy is not installed")
    from minidnn.algo_cache import AlgoCache
    from minidnn.ops.conv_algos import Geom
    g = Geom(2, 3, 8, 8, 4, 3, 3, 8, 8, (1, 1), (1, 1), (1, 1), 1, np.dtype(np.float32))
    runs = []

    def fake_find(self, geom, pass_):
        runs.append(pass_)
        if pass_ == "forward":
            return {"forward": {"GEMM": (2000, 2e-3, 1), "IMPLICIT_GEMM": (0, 5e-3, 1)}}
        return {"data": {"ALGO_1": (1000, 1e-3, 2), "ALGO_0": (0, 3e-3, 1)},
                "filter": {"ALGO_1": (1000, 1e-3, 1), "ALGO_0": (0, 4e-3, 1)}}

    cache = AlgoCache(tmp_path / "algos.json")
    first = conv_mod.CudnnConv(_FakeCudnn, None, cache=cache, device_name="Fake GPU")
    second = conv_mod.CudnnConv(_FakeCudnn, None, cache=cache, device_name="Fake GPU")
    for c in (first, second):
        c._find = fake_find.__get__(c)
    a = {p: first.timed(g, p) for p in ("forward", "backward")}
    assert runs == ["forward", "backward"]
    b = {p: second.timed(g, p) for p in ("forward", "backward")}
    assert runs == ["forward", "backward"], "the second backend measured again instead of reading the cache"
    assert a == b
    assert [al.name for al, _ in a["forward"].values()] == ["GEMM", "IMPLICIT_GEMM"]
    assert a["forward"]["GEMM"][0].workspace == 2000            # Find's own workspace, cached or not
    assert second._math[(g, "data", "ALGO_1")] == 2                # and the math type it was timed with
    assert list(a["backward"]) == ["ALGO_1/ALGO_1", "ALGO_0/ALGO_0"]   # the time/workspace front
    assert a["backward"]["ALGO_0/ALGO_0"][1] == pytest.approx(7e-3)
    other = conv_mod.CudnnConv(_FakeCudnn, None, cache=cache, device_name="Another GPU")
    other._find = fake_find.__get__(other)
    other.timed(g, "forward")
    assert runs[-1] == "forward" and len(runs) == 3           # another GPU's times are its own


def test_the_default_profile_on_a_gpu_is_that_gpus():
    """MemoryConfig's default (the CPU's profile) times non-convolution steps and copies at the GPU's
    speed on CUDA; an explicit GPU profile or "measured" stays."""
    from minidnn.memory.config import CPU_PROFILE, MemoryConfig, gpu_profile
    from minidnn.memory.profiles import get_profile
    assert MemoryConfig().profile == CPU_PROFILE
    assert gpu_profile(CPU_PROFILE, "NVIDIA H200") == "h200-141gb"
    assert gpu_profile(CPU_PROFILE, "NVIDIA A100-SXM4-80GB") == "a100-40gb"
    assert get_profile(gpu_profile(CPU_PROFILE, "Some Future GPU")).name.startswith("h100")
    assert gpu_profile("v100-16gb", "NVIDIA H200") == "v100-16gb"
    assert gpu_profile("measured", "NVIDIA H200") == "measured"


def test_find_runs_and_is_cached_per_dtype(tmp_path):
    """A layer's bf16, fp16 and fp32 algorithms are measured and kept apart: one Find each, keys that name
    the dtype, and the cache answers each with its own."""
    conv_mod = pytest.importorskip("minidnn.backend.cuda.conv", reason="CuPy is not installed")
    from minidnn.algo_cache import AlgoCache
    from minidnn.ops.conv_algos import Geom
    from minidnn.precision import BF16, FP16
    runs = []

    def fake_find(self, geom, pass_):
        runs.append(np.dtype(geom.dtype).name)
        ws = {"float32": 4000, "float16": 2000, "bfloat16": 3000}[np.dtype(geom.dtype).name]
        return {"forward": {"IMPLICIT_PRECOMP_GEMM": (ws, 1e-3, 1), "IMPLICIT_GEMM": (0, 2e-3, 1)}}

    cache = AlgoCache(tmp_path / "algos.json")
    geoms = {dt: Geom(2, 3, 8, 8, 4, 3, 3, 8, 8, (1, 1), (1, 1), (1, 1), 1, np.dtype(dt))
             for dt in (np.float32, FP16, BF16)}
    first = conv_mod.CudnnConv(_FakeCudnn, None, cache=cache, device_name="Fake GPU")
    first._find = fake_find.__get__(first)
    got = {g.dtype.name: first.timed(g, "forward")["IMPLICIT_PRECOMP_GEMM"][0].workspace for g in geoms.values()}
    assert got == {"float32": 4000, "float16": 2000, "bfloat16": 3000}
    assert sorted(runs) == ["bfloat16", "float16", "float32"]
    keys = {dt: first._cache_key(g, "forward") for dt, g in geoms.items()}
    assert len(set(keys.values())) == 3 and '"dtype":"bfloat16"' in keys[BF16]
    second = conv_mod.CudnnConv(_FakeCudnn, None, cache=cache, device_name="Fake GPU")
    second._find = fake_find.__get__(second)
    assert {g.dtype.name: second.timed(g, "forward")["IMPLICIT_PRECOMP_GEMM"][0].workspace
            for g in geoms.values()} == got
    assert len(runs) == 3                       # the second backend read all three from the cache


class _DtypeConv(_FakeConv):
    """A stand-in for cuDNN that records the dtype of every layer it is asked about."""

    def __init__(self):
        super().__init__()
        self.asked = []

    def algorithms(self, op, ins, outs, pass_):
        self.asked.append(np.dtype(ins[0].dtype).name)
        return super().algorithms(op, ins, outs, pass_)

    def seconds(self, op, ins, outs, pass_, name):
        self.asked.append(np.dtype(ins[0].dtype).name)
        return super().seconds(op, ins, outs, pass_, name)


def test_a_convolution_is_planned_at_the_dtype_its_kernels_run_in():
    """The cost model asks cuDNN about a bf16 convolution in bf16 where the op runs natively (cuDNN's own
    workspaces), and in fp32 where it is staged through fp32 (ops.staging: the staging buffers added to
    each workspace, as the staged op carves them)."""
    from types import SimpleNamespace

    from minidnn.backend.cuda.cost import DeviceCost, kernel_specs
    from minidnn.graph import Spec
    from minidnn.memory.costmodel import ProfileCost
    from minidnn.ops.conv import Conv2dOp
    from minidnn.ops.staging import staged
    from minidnn.precision import BF16
    from minidnn.schedule import aligned
    ins, outs = [Spec((4, 8, 8, 8), BF16), Spec((8, 8, 3, 3), BF16)], [Spec((4, 8, 8, 8), BF16)]
    for pass_ in ("forward", "backward"):
        fake = _DtypeConv()
        cost = DeviceCost(ProfileCost("h200-141gb"), SimpleNamespace(conv=fake))
        native = cost.algorithms(Conv2dOp(padding=1), ins, outs, pass_)
        assert fake.asked == ["bfloat16"]
        assert [(a.name, a.workspace) for a in native] == [(a.name, a.workspace) for a, _ in fake.lists[pass_]]
        op = staged(Conv2dOp(padding=1))
        op.infer(*ins)
        wide = cost.algorithms(op, ins, outs, pass_)
        assert fake.asked == ["bfloat16", "float32"]
        own, wide_specs = Conv2dOp(padding=1), kernel_specs(op, ins, outs, pass_)
        if pass_ == "forward":       # the staging buffers: what the staged op's workspace adds to its own
            extra = op.workspace(ins, outs) - aligned(own.workspace(*wide_specs))
        else:
            extra = op.backward_workspace(ins, outs) - aligned(own.backward_workspace(*wide_specs))
        assert extra > 0
        assert [(a.name, a.workspace) for a in wide] == [(a.name, aligned(a.workspace) + extra)
                                                          for a, _ in fake.lists[pass_]]
        assert [s.dtype for s in kernel_specs(op, ins, outs, pass_)[0]] == [np.float32, np.float32]
        assert [s.dtype for s in kernel_specs(Conv2dOp(padding=1), ins, outs, pass_)[0]] == [BF16, BF16]


def test_a_bf16_schedule_plans_with_a_devices_algorithms():
    """`compile(precision="bf16")`'s schedule on the CUDA cost model: every convolution step takes one of the
    device's algorithms, asked at the dtype its kernels run in, and a budget still trades workspaces."""
    from types import SimpleNamespace

    from minidnn.autograd import build_schedule
    from minidnn.backend.cuda.cost import DeviceCost, kernel_specs
    from minidnn.graph import trace
    from minidnn.memory import MemoryConfig, plan_memory
    from minidnn.memory.costmodel import ProfileCost
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                        nn.Flatten(), nn.Linear(8 * 8 * 8, 10)).init_parameters(0)
    sched = build_schedule(trace(net, (4, 3, 8, 8), loss=nn.CrossEntropyLoss(), precision="bf16"),
                           optimizer=optim.SGD(lr=0.1))
    fake = _DtypeConv()
    cost = DeviceCost(ProfileCost("h200-141gb"), SimpleNamespace(conv=fake))
    convs = [s for s in sched.steps if s.node is not None and s.node.op.name == "conv2d"
             and s.kind in ("forward", "backward")]
    assert convs
    runs_in = {np.dtype(kernel_specs(s.node.op, [v.spec for v in s.node.inputs], [o.spec for o in s.node.outputs],
                                     s.kind)[0][0].dtype).name for s in convs}
    free = plan_memory(sched, MemoryConfig(), cost)
    assert set(fake.asked) == runs_in
    assert {free.algos[s.index].name for s in convs} == {"FAST", "ALGO_1/ALGO_1"}
    tight = plan_memory(sched, MemoryConfig(budget=free.peak_bytes - (1 << 20)), cost)
    assert tight.peak_bytes <= tight.budget
    assert any(tight.algos[s.index].workspace < free.algos[s.index].workspace for s in convs)


def test_16_bit_gemms_accumulate_in_float32():
    gemm = pytest.importorskip("minidnn.backend.cuda.gemm", reason="CuPy is not installed")
    from cupy_backends.cuda.libs import cublas
    assert {n: t[1] for n, t in gemm.TYPES.items()} == {
        "float16": cublas.CUBLAS_COMPUTE_32F, "bfloat16": cublas.CUBLAS_COMPUTE_32F,
        "float32": cublas.CUBLAS_COMPUTE_32F, "float64": cublas.CUBLAS_COMPUTE_64F}
    assert all(t[2] == np.float32 for n, t in gemm.TYPES.items() if n != "float64")   # alpha, beta: float


# -- mixed precision on a GPU ----------------------------------------------------------------------------
# u = eps / 2 (round to nearest even), half the spacing of the subnormals, fp32's eps (as test_mixed_precision_ops)
U = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
TINY = {"bf16": 2.0 ** -134, "fp16": 2.0 ** -25}
EPS32 = 2.0 ** -23
BILINEAR = ("conv2d", "conv_transpose2d", "linear")     # cuDNN's and cuBLAS's ops; the others: minidnn's kernels


def _native_cases():
    from minidnn.backend.cuda.precision import NATIVE_OPS
    from test_mixed_precision_ops import CASES
    return [name for name, case in CASES.items() if case[0]().name in NATIVE_OPS]


def _on_cuda(backend, op, arrays, gy, seed=0):
    """(outputs, input gradients) as host arrays of ``op`` itself (never staged) on the CUDA backend, as
    harness.run_op runs it on the CPU: each pass with the workspace it asks for, the backward with the
    inputs and outputs the op saves."""
    from minidnn.executor import Context
    from minidnn.graph import Spec
    xp = backend.xp
    dev = [xp.asarray(a) for a in arrays]
    specs = [Spec(a.shape, a.dtype) for a in arrays]
    out_specs = op.infer(*specs)
    outs = [xp.empty(s.shape, s.dtype) for s in out_specs]
    gins = [None if i in op.no_grad_inputs else xp.empty(s.shape, s.dtype) for i, s in enumerate(specs)]
    with backend.compute_scope():
        op.forward(Context.on(backend, np.random.default_rng(seed)), dev, outs,
                   backend.empty(op.workspace(specs, out_specs)))
        op.backward(Context.on(backend, np.random.default_rng(seed)),
                    [a if i in op.saved_inputs else None for i, a in enumerate(dev)],
                    [o if i in op.saved_outputs else None for i, o in enumerate(outs)],
                    [xp.asarray(gy, out_specs[0].dtype)] + [None] * (len(outs) - 1), gins,
                    backend.empty(op.backward_workspace(specs, out_specs)))
    backend.synchronize()
    return [host(o) for o in outs], [None if g is None else host(g) for g in gins]


@needs_gpu
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", _native_cases())
def test_op_in_low_precision_on_cuda_against_its_fp32_result(name, precision):
    """Every op the CUDA backend runs natively in a 2-byte type, forward and gradients, against the same op in
    fp32 on CUDA on the same (rounded) values.

    - minidnn's kernels (ReLU, add, the pools, BatchNorm): a 2-byte kernel widens exactly, computes as the
      float kernel (sums in double, arithmetic in float) and rounds once (kernel_sources), so its result is
      the fp32 result rounded, bit for bit; BatchNorm's fp32 statistics and parameter gradients are equal.
      Eval-mode BatchNorm's parameter gradients are CuPy's per-channel sums of the 2-byte gy: rounded once
      after an fp32 accumulation, within u |g| + 2 K eps32 S (S = the sum of the terms' magnitudes).
    - cuDNN's convolutions and cuBLAS's GEMMs: both runs accumulate in fp32, in orders of their own, each
      within K eps32 S of the exact sum (K: the reduction length, at most the largest array here; S: the op
      on the inputs' and gy's magnitudes, in float64 on the CPU); the 2-byte result is rounded (u |y|), and
      one intermediate rounding is allowed (the bias added to cuDNN's rounded result, a transform's operands
      kept in the data type): u S. Bound: u |y32| + (1.02 u + 2 K eps32) S + tiny. An fp16/bf16 accumulation
      would miss it by up to K u S."""
    from harness import rng_for, run_op
    from minidnn.graph import Spec
    from minidnn.precision import BF16, FP16, FP32
    from test_mixed_precision_ops import CASES
    backend = get_backend("cuda")
    make, raw, rounded, _, _ = CASES[name]
    low, u, tiny = {"bf16": BF16, "fp16": FP16}[precision], U[precision], TINY[precision]
    lows = [a.astype(low) if i in rounded else a for i, a in enumerate(raw)]
    wide = [a.astype(FP32) if i in rounded else a for i, a in enumerate(lows)]      # the same values in fp32
    shape = make().infer(*[Spec(a.shape, a.dtype) for a in wide])[0].shape
    gy = rng_for("cuda-mp", name, "gy").standard_normal(shape).astype(np.float32).astype(low)
    outs32, g32 = _on_cuda(backend, make(), wide, gy.astype(FP32))
    outs, glow = _on_cuda(backend, make(), lows, gy)
    assert outs[0].dtype == low and outs32[0].dtype == FP32
    op = make()
    # (2-byte run's array, fp32 run's, the input whose gradient it is: None for an output); the outputs are
    # the result and those the backward reads (eval-mode BatchNorm leaves its mean output unwritten)
    checks = [(a, b, None) for j, (a, b) in enumerate(zip(outs, outs32)) if j == 0 or j in op.saved_outputs]
    checks += [(a, b, i) for i, (a, b) in enumerate(zip(glow, g32)) if a is not None]
    if op.name in BILINEAR:
        k = max([a.size for a in raw] + [gy.size])
        s_outs, s_grads = run_op(make(), [np.abs(a.astype(np.float64)) for a in wide],
                                 np.abs(gy.astype(np.float64)))
        for a, b, i in checks:
            s = s_outs[0] if i is None else s_grads[i]
            bound = u * np.abs(b) + (1.02 * u + 2 * k * EPS32) * s + tiny
            err = np.abs(a.astype(np.float64) - b)
            assert np.all(err <= bound), (name, i, float((err / bound).max()))
        return
    frozen = op.name == "batch_norm2d" and not op.training
    for a, b, i in checks:
        if frozen and i in (1, 2):          # d gamma = sum gy * xhat, d beta = sum gy, per channel
            xhat = (wide[0] - wide[3].reshape(1, -1, 1, 1)) / np.sqrt(wide[4].reshape(1, -1, 1, 1) + op.eps)
            terms = np.abs(gy.astype(np.float64)) * (np.abs(xhat) if i == 1 else 1.0)
            s, k = terms.sum(axis=(0, 2, 3)), gy.size // gy.shape[1]
            assert np.all(np.abs(a.astype(np.float64) - b) <= u * np.abs(b) + 2 * k * EPS32 * s + tiny), (name, i)
        else:                               # a 2-byte result is the fp32 one rounded; an fp32 one is equal
            assert a.dtype in (low, FP32) and np.array_equal(a, b.astype(a.dtype), equal_nan=True), (name, i)


class _Residual(nn.Module):
    """conv-BN-ReLU-maxpool, conv-BN + residual add-ReLU, global average pool, linear: the ops the CUDA backend
    runs natively in bf16/fp16 (precision.NATIVE_OPS), the casts between, and one staged op (the pool)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1, self.pool = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.MaxPool2d(2)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        y = self.pool(nn.relu(self.bn1(self.conv1(x))))
        y = nn.relu(self.bn2(self.conv2(y)) + y)
        return self.fc(nn.flatten(nn.functional.adaptive_avg_pool2d(y)))


@needs_gpu
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_step_on_cuda_equals_the_cpus(precision):
    """One bf16/fp16 training step on CUDA against the same step on the CPU backend, same weights and batch.

    The two run the same graph on the same values and differ only in the order of their fp32 accumulations
    (cuDNN/cuBLAS against the CPU's kernels): within 2 K eps32 of each result's magnitude, K the longest
    reduction (conv2: 8 * 3 * 3), which may flip the rounding of a 2-byte result: 2 u relative. Each of the
    D = 6 ops of the forward that round a result (two convolutions, two BatchNorms, the average pool, the
    linear layer) passes a relative error on with gain about 1 (BatchNorm renormalizes), so the loss and the
    BatchNorm statistics agree within R = D (2 u + 2 K eps32) relative, and the gradients, through as many
    rounding ops again in the backward, within 2 R (max-norm, per tensor). bf16: R = 0.047, fp16: 0.006."""
    u, k, depth = U[precision], 8 * 3 * 3, 6
    r = depth * (2 * u + 2 * k * EPS32)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3, 16, 16)).astype(np.float32), rng.integers(0, 10, 8)
    runs = {}
    for device in ("cpu", "cuda"):
        net = _Residual().init_parameters(0)
        tr = mdn.compile(net, x.shape, nn.CrossEntropyLoss(), optim.SGD(lr=0.1, momentum=0.9), device=device,
                         precision=precision)
        loss = tr.step(x, y)
        runs[device] = (loss, {n: host(p.grad) for n, p in net.named_parameters()},
                        {n: host(b.data) for n, b in net.named_buffers() if "running" in n},
                        tr.scaler.state_dict() if tr.scaler is not None else None)
    (lc, gc, bc, sc), (lg, gg, bg, sg) = runs["cpu"], runs["cuda"]
    assert np.isfinite(lg) and abs(lg - lc) <= r * max(1.0, abs(lc)), (lg, lc)
    assert sc == sg                                  # fp16: the same loss scale, no step skipped
    for n, g in gc.items():
        assert gg[n].dtype == np.float32 and np.abs(g).max() > 0, n          # fp32 master gradients
        assert np.abs(gg[n] - g).max() <= 2 * r * np.abs(g).max(), (n, float(np.abs(gg[n] - g).max()))
    for n, b in bc.items():
        assert np.abs(bg[n] - b).max() <= r * np.abs(b).max(), n
