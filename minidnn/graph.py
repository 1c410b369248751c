"""Capture: run a module's ``forward`` once on symbolic values to get a Graph.

A :class:`Value` stands for a tensor of known shape and dtype; calling layers
and functional ops on values records :class:`Node`s in the value's graph. No
kernel runs while tracing. The graph is reached through the values themselves,
so tracing needs no global state.
"""
from __future__ import annotations

import math
import numbers
import operator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .errors import MinidnnError, ShapeError


class TracingError(MinidnnError, AttributeError, TypeError):
    """A traced value was asked for a tensor method, attribute or operand it does not support;
    the message names the module path (an AttributeError for ``hasattr``, a TypeError for operands)."""


_SUPPORTED = ("traced values support .view, .reshape, .flatten, .contiguous, .relu, .sigmoid, .tanh, "
              ".size, .dim, .numel, .shape, .ndim, .dtype, +, -, *, / with a Python number "
              "(+ and - also with another traced value), and basic indexing (ints, slices with positive "
              "steps, ... and None, dim 0 whole); minidnn.nn.functional has the other ops")


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real)


def _is_tensor(x) -> bool:
    return isinstance(x, Value) or (hasattr(x, "data") and hasattr(x, "requires_grad"))


@dataclass(frozen=True)
class Spec:
    """Shape and dtype of a tensor."""

    shape: tuple
    dtype: np.dtype

    @cached_property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


class Value:
    """A symbolic tensor in a graph: what ``forward`` sees while tracing."""

    def __init__(self, graph, vid, spec, kind, name, producer=None):
        self.graph = graph
        self.id = vid
        self.spec = spec
        self.kind = kind          # "input", "label", "param", "state", "activation"
        self.name = name
        self.producer = producer  # the Node that writes it, None for graph inputs
        self.param = None         # the Parameter (or buffer array owner) for params/state

    shape = property(lambda self: self.spec.shape)
    dtype = property(lambda self: self.spec.dtype)
    ndim = property(lambda self: len(self.spec.shape))
    nbytes = property(lambda self: self.spec.nbytes)

    __array_ufunc__ = None    # NumPy scalars defer to the operators below (0.5 * y with np.float64)

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self):
        return self.ndim

    def numel(self):
        return math.prod(self.shape)

    # -- PyTorch's tensor methods, recorded as ops ----------------------------
    def _unsupported(self, what):
        where = self.graph.path or "<root>"
        return TracingError(f"{where}: {what} is not supported on the traced value {self.name} "
                            f"(shape {self.shape}); {_SUPPORTED}")

    def _shape_arg(self, method, args):
        if len(args) == 1 and isinstance(args[0], (tuple, list)):
            args = tuple(args[0])
        try:
            return tuple(operator.index(d) for d in args)
        except TypeError:
            raise self._unsupported(f".{method}{args!r} (dimensions must be ints)") from None

    def view(self, *shape):
        """``x.view(n, -1)`` or ``x.view((n, -1))``: a reshape (one -1 is inferred)."""
        from .ops.elementwise import reshape
        return reshape(self, self._shape_arg("view", shape))

    def reshape(self, *shape):
        from .ops.elementwise import reshape
        return reshape(self, self._shape_arg("reshape", shape))

    def flatten(self, start_dim=0, end_dim=-1):
        """As ``torch.Tensor.flatten``: from ``start_dim`` (default 0, as in PyTorch; nn.Flatten's is 1)."""
        from .ops.elementwise import flatten
        return flatten(self, start_dim, end_dim)

    def contiguous(self):
        return self

    def relu(self):
        from .ops.activation import relu
        return relu(self)

    def sigmoid(self):
        from .ops.activation import sigmoid
        return sigmoid(self)

    def tanh(self):
        from .ops.activation import tanh
        return tanh(self)

    # -- operators: with a Python number (scalar_affine) or a tensor (add) ------
    def _affine(self, scale=1.0, shift=0.0):
        from .ops.elementwise import scalar_affine
        return scalar_affine(self, scale, shift)

    def __add__(self, other):
        if _is_number(other):
            return self._affine(shift=other)
        if _is_tensor(other):
            from .ops.elementwise import add
            return add(self, other)
        raise self._unsupported(f"adding a {type(other).__name__}")

    __radd__ = __add__

    def __sub__(self, other):
        if _is_number(other):
            return self._affine(shift=-other)
        if _is_tensor(other):
            from .ops.elementwise import add
            return add(self, -as_value(self.graph, other))
        raise self._unsupported(f"subtracting a {type(other).__name__}")

    def __rsub__(self, other):
        if _is_number(other):
            return self._affine(-1.0, other)
        if _is_tensor(other):
            from .ops.elementwise import add
            return add(other, -self)
        raise self._unsupported(f"subtracting from a {type(other).__name__}")

    def __neg__(self):
        return self._affine(-1.0)

    def __pos__(self):
        return self

    def __mul__(self, other):
        if _is_number(other):
            return self._affine(scale=other)
        if _is_tensor(other):
            raise self._unsupported("an elementwise product of two tensors")
        raise self._unsupported(f"multiplying by a {type(other).__name__}")

    __rmul__ = __mul__

    def __truediv__(self, other):
        if _is_number(other):
            if other == 0:
                raise self._unsupported("division by zero")
            return self._affine(scale=1.0 / other)
        raise self._unsupported(f"dividing by a {type(other).__name__}")

    def __rtruediv__(self, other):
        raise self._unsupported(f"dividing a {type(other).__name__} by a tensor")

    def __getitem__(self, index):
        """Basic indexing as PyTorch's (``x[:, 1:3]``, ``x[..., ::2]``, ``x[:, 0]``, ``x[:, None]``),
        with dim 0 (the batch) taken whole; anything else is a TracingError naming the module path."""
        from .ops.index import UnsupportedIndex, getitem, show
        try:
            return getitem(self, index)
        except UnsupportedIndex as e:
            raise self._unsupported(f"indexing [{show(index)}] with {e}") from None

    def __iter__(self):
        raise self._unsupported("iterating")

    def _no_operator(symbol):
        def op(self, other):
            raise self._unsupported(f"the operator {symbol}")
        return op

    __matmul__ = __rmatmul__ = _no_operator("@")
    __pow__ = __rpow__ = _no_operator("**")
    __floordiv__ = __rfloordiv__ = _no_operator("//")
    __mod__ = __rmod__ = _no_operator("%")
    del _no_operator

    def __getattr__(self, name):
        # only reached for attributes a Value lacks; private names keep Python's usual error
        if name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        raise self._unsupported(f"the attribute or method .{name}")

    def __repr__(self):
        return f"Value({self.name}, shape={self.shape}, dtype={np.dtype(self.dtype).name})"


@dataclass
class Node:
    """One op applied to values: the unit the schedule and planner work on."""

    id: int
    op: object
    inputs: list
    outputs: list = field(default_factory=list)
    path: str = ""             # module path that made it, e.g. "layer1.0.conv1"

    @property
    def label(self):
        return f"{self.path or '<root>'}:{self.op.name}"


class Graph:
    """Values and nodes recorded by tracing, in execution order."""

    def __init__(self):
        self.values: list[Value] = []
        self.nodes: list[Node] = []
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self._param_values: dict[int, Value] = {}
        self._scopes: list[str] = []
        self.module_paths: dict[int, str] = {}
        self.precision = None          # the Precision it was traced in (minidnn.precision; None: fp32)
        self.autocast = None           # mixed precision: inserts the casts (minidnn.autocast.Autocast)
        self.casts: dict = {}          # (value id, dtype) -> the value's cast, made once per graph

    # -- values -------------------------------------------------------------
    def _new_value(self, spec, kind, name, producer=None) -> Value:
        v = Value(self, len(self.values), spec, kind, name, producer)
        self.values.append(v)
        return v

    def input(self, shape, dtype=np.float32, kind="input", name="input") -> Value:
        v = self._new_value(Spec(tuple(shape), np.dtype(dtype)), kind, name)
        self.inputs.append(v)
        return v

    def param(self, p, kind="param") -> Value:
        """The value standing for a Parameter (or a module buffer) ``p``."""
        v = self._param_values.get(id(p))
        if v is None:
            name = getattr(p, "qualname", None) or f"param{len(self._param_values)}"
            v = self._new_value(Spec(tuple(p.data.shape), p.data.dtype), kind, name)
            v.param = p
            self._param_values[id(p)] = v
        return v

    @property
    def params(self) -> list[Value]:
        return [v for v in self.values if v.kind == "param"]

    @property
    def states(self) -> list[Value]:
        return [v for v in self.values if v.kind == "state"]

    # -- nodes --------------------------------------------------------------
    @property
    def path(self) -> str:
        return self._scopes[-1] if self._scopes else ""

    @contextmanager
    def scope(self, path):
        self._scopes.append(path)
        try:
            yield
        finally:
            self._scopes.pop()

    def apply(self, op, inputs) -> list[Value]:
        """Record ``op`` applied to ``inputs``; return its output values. Under mixed precision the
        casts it needs are recorded first and it may become its staged variant (minidnn.autocast)."""
        if self.autocast is not None:
            op, inputs = self.autocast.prepare(self, op, list(inputs))
        specs = [v.spec for v in inputs]
        try:
            out_specs = op.infer(*specs)
        except ShapeError as e:
            where = self.path or "<root>"
            shapes = ", ".join(str(s.shape) for s in specs)
            raise ShapeError(f"{where} ({op.name}): {e} [input shapes {shapes}]") from None
        node = Node(len(self.nodes), op, list(inputs), path=self.path)
        base = self.path or op.name
        for i, s in enumerate(out_specs):
            suffix = "" if len(out_specs) == 1 else f".{i}"
            node.outputs.append(self._new_value(s, "activation", f"{base}:{op.name}{suffix}", node))
        self.nodes.append(node)
        return node.outputs

    def consumers(self) -> dict[int, list[Node]]:
        """value id -> nodes that read it, in execution order."""
        out: dict[int, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                out.setdefault(v.id, []).append(n)
        return out


def as_value(graph: Graph, x) -> Value:
    """``x`` as a value of ``graph``: values pass through, parameters are looked up."""
    if isinstance(x, Value):
        return x
    if hasattr(x, "data") and hasattr(x, "requires_grad"):
        return graph.param(x)
    raise TypeError(f"expected a traced value or a Parameter, got {type(x).__name__}")


def find_graph(*args) -> Graph:
    for a in args:
        if isinstance(a, Value):
            return a.graph
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, Value):
                    return b.graph
    raise TypeError("minidnn ops run on traced values: call the module through minidnn.compile")


def trace(module, input_shape, dtype=np.float32, loss=None, precision=None, native=frozenset()) -> Graph:
    """Trace ``module`` (and optionally ``loss`` on its output) into a Graph.

    ``input_shape`` includes the batch dimension. With ``loss``, the graph gets
    a label input of ``label_shape`` (default: ``(batch,)`` int64 class indices)
    and its single output is the scalar loss; otherwise the module's outputs.
    ``precision`` (a name or minidnn.precision.Precision; None: fp32): under bf16/fp16 the
    graph inserts the casts of mixed precision as it records (minidnn.autocast); ``native``: the
    ops whose kernels read and write the low dtype on the backend it is traced for (the others are
    staged through fp32).
    """
    g = Graph()
    if precision is not None:
        from .autocast import Autocast
        from .precision import get_precision
        g.precision = get_precision(precision)
        if g.precision.mixed:
            if np.dtype(dtype) != np.float32:
                raise ShapeError(f"precision {g.precision.name} trains fp32 master weights: the dtype must be "
                                 f"float32, got {np.dtype(dtype).name}")
            g.autocast = Autocast(g.precision, native)
    g.module_paths = {id(m): p for p, m in module.named_modules()}
    if loss is not None:
        g.module_paths[id(loss)] = "loss"
    x = g.input(input_shape, dtype, name="input")
    out = module(x)
    if loss is not None:
        shape, ldtype = loss.label_spec(out.spec)
        if g.autocast is not None:
            ldtype = g.autocast.label_dtype(ldtype)
        y = g.input(shape, ldtype, kind="label", name="label")
        out = loss(out, y)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    for o in outs:
        if not isinstance(o, Value):
            raise TypeError(f"forward must return traced values, got {type(o).__name__}")
    g.outputs = outs
    return g
