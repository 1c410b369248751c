"""The NCCL path: it imports without CuPy; on a GPU, a data-parallel trainer over a communicator of
one rank (NCCL all-reduces on their own stream, BatchNorm synchronized over MPI) trains exactly
what the same trainer without ``parallel`` trains."""
import importlib
import sys

import minidnn as mdn
import numpy as np
import pytest
from conftest import cuda_unavailable_reason
from minidnn import nn, optim


def test_the_nccl_module_imports_without_cupy():
    before = "cupy" in sys.modules
    importlib.import_module("minidnn.distributed.nccl")
    importlib.import_module("minidnn.distributed")
    assert ("cupy" in sys.modules) == before


def mpi_or_skip():
    """mpi4py.MPI, or a skip: without an MPI library mpi4py's import raises RuntimeError, which
    ``importorskip`` does not catch (an error, not a skip)."""
    try:
        return importlib.import_module("mpi4py.MPI")
    except (ImportError, RuntimeError) as e:
        pytest.skip(f"mpi4py.MPI does not load: {e}")


def test_mpi_without_its_library_is_a_skip(monkeypatch):
    real = importlib.import_module

    def no_library(name, *a, **kw):
        if name == "mpi4py.MPI":
            raise RuntimeError("cannot load MPI library")
        return real(name, *a, **kw)

    monkeypatch.setattr(importlib, "import_module", no_library)
    with pytest.raises(pytest.skip.Exception, match="cannot load MPI library"):
        mpi_or_skip()


def _net():
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    net.init_parameters(0)
    return net


def test_one_rank_over_nccl_trains_what_one_process_trains():
    if cuda_unavailable_reason():
        pytest.skip(cuda_unavailable_reason())
    pytest.importorskip("cupy.cuda.nccl")
    MPI = mpi_or_skip()
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((8, 3, 8, 8)), rng.integers(0, 10, 8)) for _ in range(3)]
    states = []
    for parallel in (None, mdn.distributed.DataParallel(MPI.COMM_WORLD)):
        net = _net()
        trainer = mdn.compile(net, (8, 3, 8, 8), nn.CrossEntropyLoss(), optim.SGD(lr=0.1, momentum=0.9),
                              device="cuda", dtype=np.float64, parallel=parallel)
        for x, y in batches:
            trainer.step(x, y)
        if parallel is not None:
            assert trainer.parallel.reducer.buckets
            trainer.parallel.close()
        states.append({k: trainer.backend.to_host(v) for k, v in net.state_dict().items()})
    for k in states[0]:
        np.testing.assert_allclose(states[1][k], states[0][k], rtol=1e-12, atol=1e-12, err_msg=k)
