"""The Plan: where every arena tensor lives at every step, and what it costs."""
from __future__ import annotations

from dataclasses import dataclass, field

from .config import format_bytes


@dataclass
class Plan:
    """A memory plan for one iteration, produced by a planner and carried out exactly.

    Byte figures: ``persistent_bytes`` (parameters, gradients, optimizer and BN
    state), ``arena_bytes`` (the arena's size: the largest end offset of any
    placed buffer), ``peak_bytes`` = persistent + arena, ``ideal_bytes``
    (persistent + every arena tensor resident at once), ``liveness_peak_bytes``
    (persistent + the largest sum of bytes live at one step).
    """

    schedule: object
    steps: list
    spans: dict                   # tensor id -> (first step, last step)
    offsets: dict                 # tensor id -> arena offset
    sizes: dict                   # tensor id -> bytes
    persistent_bytes: int
    arena_bytes: int
    ideal_bytes: int
    liveness_peak_bytes: int
    live_curve: list = field(default_factory=list)   # arena bytes live at each step
    budget: int = None
    policy: str = "none"

    @property
    def peak_bytes(self) -> int:
        return self.persistent_bytes + self.arena_bytes

    @property
    def fragmentation_bytes(self) -> int:
        return self.peak_bytes - self.liveness_peak_bytes

    def summary(self, top=10) -> str:
        s = self.schedule
        lines = [
            f"plan ({self.policy}): {len(self.steps)} steps, {len(self.offsets)} arena buffers",
            f"  ideal (no reuse)      {format_bytes(self.ideal_bytes):>12}  ({self.ideal_bytes} B)",
            f"  liveness peak         {format_bytes(self.liveness_peak_bytes):>12}  ({self.liveness_peak_bytes} B)",
            f"  plan peak             {format_bytes(self.peak_bytes):>12}  ({self.peak_bytes} B)"
            f" = persistent {format_bytes(self.persistent_bytes)} + arena {format_bytes(self.arena_bytes)}",
            f"  fragmentation         {format_bytes(self.fragmentation_bytes):>12}",
        ]
        if self.budget is not None:
            lines.append(f"  budget                {format_bytes(self.budget):>12}  ({self.budget} B)")
        if self.live_curve:
            at = max(range(len(self.live_curve)), key=self.live_curve.__getitem__)
            lines.append(f"  peak at step {at}: {self.steps[at].label} ({self.steps[at].kind})")
            live = [t for t, (a, b) in self.spans.items() if a <= at <= b]
            live.sort(key=lambda t: -self.sizes[t])
            lines.append(f"  largest tensors live there:")
            for t in live[:top]:
                tt = s.tensor(t)
                lines.append(f"    {format_bytes(self.sizes[t]):>12}  {tt.category:<20} {tt.name}")
        return "\n".join(lines)
