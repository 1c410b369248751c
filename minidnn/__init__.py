"""minidnn: a minimal deep-learning framework whose executor plans every buffer to fit a memory budget."""
from . import nn, optim
from .errors import (BackendUnavailable, CheckpointError, DataError, MemoryBudgetError, MinidnnError,
                     NumericalError, ShapeError)
from .memory import MemoryConfig
from .trainer import Trainer, compile

__version__ = "0.1.0"

__all__ = ["nn", "optim", "compile", "Trainer", "MemoryConfig", "ShapeError", "MemoryBudgetError",
           "BackendUnavailable", "DataError", "CheckpointError", "NumericalError", "MinidnnError"]
