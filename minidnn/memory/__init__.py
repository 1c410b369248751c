"""The memory manager: liveness, placement, planners and the Plan they produce."""
from .config import MemoryConfig, format_bytes, parse_bytes
from .plan import Plan
from .planner import plan_memory, plan_resident

__all__ = ["MemoryConfig", "Plan", "plan_memory", "plan_resident", "format_bytes", "parse_bytes"]
