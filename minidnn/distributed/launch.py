"""Whether this process was started by an MPI launcher as one of several ranks."""
from __future__ import annotations

import os

# what the launchers set in each process: MPICH's Hydra (PMI), Open MPI, Slurm's srun
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")


def launched_size() -> int:
    """The number of ranks the launcher started (1 outside a launcher), from the environment alone."""
    for name in _SIZE_VARIABLES:
        value = os.environ.get(name)
        if value and value.isdigit():
            return int(value)
    return 1


def launched(**options):
    """A :class:`DataParallel` over ``MPI.COMM_WORLD`` when started as one of several ranks
    (``mpiexec -n N``), else None; ``options`` go to DataParallel."""
    if launched_size() < 2:
        return None
    from .parallel import DataParallel
    return DataParallel(**options)


def abort(status):
    """End every rank of the job (after a rank failed: the others must not wait on it at exit)."""
    import sys
    if "mpi4py.MPI" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.modules["mpi4py.MPI"].COMM_WORLD.Abort(status)
