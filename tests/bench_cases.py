"""A row of scripts/bench_optimal.py's table, for the tests that check the floor, the reference
and the heuristic on it: random DAG 16 (seed 0) on v100-16gb, with SGD (momentum, weight decay)."""
import numpy as np

from minidnn import nn, optim
from minidnn.autograd import build_schedule
from minidnn.graph import trace
from minidnn.memory import MemoryConfig, plan_memory
from minidnn.memory.costmodel import CachedCost, ProfileCost
from minidnn.models.random_dag import SHAPE, RandomDag, random_spec

PROFILE = "v100-16gb"


def dag0_at(fraction):
    """(schedule, cost, budget bytes): the persistent bytes plus ``fraction`` of the liveness peak's
    arena, as bench_optimal.py budgets it."""
    sched = build_schedule(trace(RandomDag(random_spec(np.random.default_rng(0), 16)), SHAPE,
                                 loss=nn.CrossEntropyLoss()),
                           optimizer=optim.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4))
    cost = CachedCost(ProfileCost(PROFILE))
    unlimited = plan_memory(sched, MemoryConfig(profile=PROFILE), cost)
    persistent = sched.persistent_bytes
    return sched, cost, int(persistent + fraction * (unlimited.peak_bytes - persistent))
