"""Error types a user can catch."""


class MinidnnError(Exception):
    """Base class of every error minidnn raises on purpose."""


class ShapeError(MinidnnError, ValueError):
    """A shape or dtype does not fit an op; the message names the module path."""


class MemoryBudgetError(MinidnnError, ValueError):
    """The memory budget is below what any plan needs.

    ``minimum_bytes`` is the smallest budget that would be feasible.
    """

    def __init__(self, message, minimum_bytes, budget_bytes=None):
        super().__init__(message)
        self.minimum_bytes = int(minimum_bytes)
        self.budget_bytes = budget_bytes


class BackendUnavailable(MinidnnError, RuntimeError):
    """The requested backend (e.g. ``cuda``) cannot run on this machine."""


class DataError(MinidnnError, ValueError):
    """A data set file is missing, truncated or malformed; the message names it."""


class CheckpointError(MinidnnError, ValueError):
    """A checkpoint is missing, corrupt or belongs to another model."""


class NumericalError(MinidnnError, FloatingPointError):
    """A non-finite value appeared (e.g. NaN loss); the message names the step."""


class ConfigError(MinidnnError, ValueError):
    """An argument is outside its range (a NaN learning rate, a momentum of 2, ...); the message names it."""


class DistributedError(MinidnnError, RuntimeError):
    """Data-parallel ranks disagree (their configurations differ) or one failed; the message names it."""
