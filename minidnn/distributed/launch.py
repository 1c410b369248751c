"""Whether this process was started by an MPI launcher as one of several ranks."""
from __future__ import annotations

import os

# what the launchers set in each process: MPICH's Hydra (PMI), Open MPI, Slurm's srun
_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")
# between a failed rank's last words and its Abort: the launcher forwards a rank's output through a proxy
# while it acts on an Abort at once, killing every rank and that proxy, so a line written just before the
# Abort can be lost with the job (the distributed tests keep their workers' errors in files for that
# reason); half a second lets the proxy forward it, even on a loaded machine, and delays nothing but a
# job that is failing anyway
FORWARD_SECONDS = 0.5


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
    """End every rank of the job (after a rank failed: the others must not wait on it at exit), once what
    this rank has written has had time to reach the launcher's terminal."""
    import sys
    import time
    if "mpi4py.MPI" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(FORWARD_SECONDS)
        sys.modules["mpi4py.MPI"].COMM_WORLD.Abort(status)
