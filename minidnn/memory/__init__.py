"""The memory manager: liveness, lowering, placement, cost model, simulator and planners."""
from .bound import Floor, step_time_floor
from .config import MemoryConfig, format_bytes, parse_bytes
from .costmodel import MeasuredCost, ProfileCost
from .plan import Plan
from .planner import lower_bound, minimum_bytes, plan_memory
from .profiles import PROFILES, DeviceProfile, get_profile

__all__ = ["MemoryConfig", "Plan", "plan_memory", "lower_bound", "minimum_bytes", "format_bytes", "parse_bytes",
           "MeasuredCost", "ProfileCost", "PROFILES", "DeviceProfile", "get_profile", "Floor", "step_time_floor"]
