"""Random DAGs of ops over a small input: the planner's property tests and its exact reference's benchmark.

A DAG is a list of nodes over a (2, 4, 6, 6) input (node 0); node k reads earlier nodes:

    ("conv", i)      3x3 convolution, 4 -> 4 channels, padding 1, with bias
    ("relu", i)
    ("add", i, j)
    ("cat", i, j)    channel concatenation, then a 1x1 convolution 8 -> 4 channels
    ("bn", i)        BatchNorm2d(4), training mode
    ("pool", i)      MaxPool2d(3, stride=1, padding=1)

then flatten, Linear(144, 3) and cross-entropy on the last node. Nodes that do not
reach the last one are dead code: they run forward but get no gradient.
"""
from __future__ import annotations

from minidnn import nn

SHAPE = (2, 4, 6, 6)
CLASSES = 3
OPS = ["conv", "relu", "add", "cat", "bn", "pool"]


class RandomDag(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.spec = [tuple(n) for n in spec]
        for k, node in enumerate(self.spec, start=1):
            op = node[0]
            if op == "conv":
                setattr(self, f"n{k}", nn.Conv2d(4, 4, 3, padding=1))
            elif op == "cat":
                setattr(self, f"n{k}", nn.Conv2d(8, 4, 1))
            elif op == "bn":
                setattr(self, f"n{k}", nn.BatchNorm2d(4))
            elif op == "relu":
                setattr(self, f"n{k}", nn.ReLU())
            elif op == "pool":
                setattr(self, f"n{k}", nn.MaxPool2d(3, stride=1, padding=1))
        self.fc = nn.Linear(SHAPE[1] * SHAPE[2] * SHAPE[3], CLASSES)

    def forward(self, x):
        vals = [x]
        for k, node in enumerate(self.spec, start=1):
            op = node[0]
            if op == "add":
                vals.append(vals[node[1]] + vals[node[2]])
            elif op == "cat":
                vals.append(getattr(self, f"n{k}")(nn.functional.cat([vals[node[1]], vals[node[2]]], dim=1)))
            else:
                vals.append(getattr(self, f"n{k}")(vals[node[1]]))
        return self.fc(nn.functional.flatten(vals[-1], 1))


def random_spec(rng, nodes) -> list:
    """A DAG of ``nodes`` nodes drawn with ``rng`` (a numpy Generator) as the property tests draw
    theirs: each node's op uniformly from OPS, its inputs uniformly among the earlier nodes."""
    spec = []
    for k in range(1, nodes + 1):
        op = OPS[rng.integers(len(OPS))]
        i = int(rng.integers(k))
        spec.append((op, i, int(rng.integers(k))) if op in ("add", "cat") else (op, i))
    return spec
