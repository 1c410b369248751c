"""Memory policies by name. Each is an object with ``name`` and
``evictions(schedule, arena_limit, cost, touches) -> {(tensor, gap): Evict} | None``."""
from __future__ import annotations

from .baselines import VDNN, CheckpointSqrt, MoDNN, SuperNeurons, VDNNDynamic
from .planner import AutoPolicy


class NoEviction:
    """Liveness reuse only: every tensor stays on the device from first to last use."""

    name = "none"

    def evictions(self, schedule, limit, cost, touch):
        return None


POLICIES = {
    "auto": AutoPolicy,
    "none": NoEviction,
    "swap": lambda: AutoPolicy(recompute=False, name="swap"),
    "recompute": lambda: AutoPolicy(offload=False, name="recompute"),
    # the papers' policies (baselines.py): each documents its rule and the details chosen
    "vdnn_all": lambda: VDNN(convs_only=False),
    "vdnn_conv": lambda: VDNN(convs_only=True),
    "vdnn_dyn": VDNNDynamic,
    "checkpoint_sqrt": CheckpointSqrt,
    "superneurons": SuperNeurons,
    "modnn": MoDNN,
}


def get_policy(name):
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown memory policy {name!r}; known: {', '.join(POLICIES)}") from None
