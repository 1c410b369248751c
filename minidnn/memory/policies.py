"""Memory policies by name, and the one protocol every policy implements.

A policy is an object with a ``name`` and one method, ``chooser``: given the
fixed facts of one schedule (facts.Facts) it returns a function from an arena limit (bytes)
to ``(evictions {(tensor, gap): Evict}, algorithms {step: Algo})``, or
``(None, None)`` where it cannot meet that limit. ``plan_memory`` asks it for
several limits while it searches (a resumable policy such as the greedy
answers a lower limit by continuing where it stopped).
"""
from __future__ import annotations

from typing import Callable, Protocol

from .baselines import VDNN, CheckpointSqrt, MoDNN, SuperNeurons, VDNNDynamic
from .greedy import AutoPolicy


class Policy(Protocol):
    name: str

    def chooser(self, facts, cost, options: dict, algos: dict) -> Callable[[int], tuple]:
        """limit -> (evictions or None, algorithms or None) for ``facts.schedule``."""


class NoEviction:
    """Liveness reuse only: every tensor stays on the device from first to last use."""

    name = "none"

    def chooser(self, facts, cost, options, algos):
        return lambda limit: (None, None)


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
# the papers' policies that ``auto`` also plans from (seeds), so it is at or below each
BASELINES = ("vdnn_all", "vdnn_conv", "vdnn_dyn", "superneurons", "modnn")


def get_policy(name) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown memory policy {name!r}; known: {', '.join(POLICIES)}") from None
