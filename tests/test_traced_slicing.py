"""Slicing traced values as a PyTorch ``forward`` does (issue #31 item 10): ``x[:, 1:3]``,
``x[..., ::2]``, ``x[:, 0]``, ``x[:, None]``; each checked through the op harness (forward,
finite differences in float64, PyTorch). Indexing it does not take (advanced or boolean
indexing, negative steps, a selection of samples) is a TracingError naming the module path;
an index out of range a ShapeError naming it."""
import numpy as np
import pytest

from harness import FnModule, OpCase, op_tests, rng_for
from minidnn import nn as mnn
from minidnn.errors import MinidnnError, ShapeError
from minidnn.graph import TracingError, trace

SHAPE = (2, 5, 4, 6)


def _case(name, key):
    x = rng_for(name, "x").standard_normal(SHAPE)
    return OpCase(name, lambda v: v[key], [x], lambda a: a[key], torch=lambda F, t: t[key])


S = slice
CASES = [
    _case("channels", (S(None), S(1, 3))),
    _case("every_other_column", (Ellipsis, S(None, None, 2))),
    _case("int_on_a_dim", (S(None), 0)),
    _case("negative_int", (S(None), -1, S(1, None))),
    _case("ints_and_steps", (S(None), S(None), S(None, None, 3), 1)),
    _case("ellipsis_in_the_middle", (S(None), Ellipsis, S(2, 5))),
    _case("new_axis", (S(None), None, S(1, 4))),
    _case("past_the_end_clamps", (S(None), S(3, 100))),
    _case("negative_bounds", (S(None), S(-4, -1), S(None, None, 2))),
    _case("numpy_int", (S(None), np.int64(2))),
    _case("whole", (Ellipsis,)),
]


test_slice_forward, test_slice_finite_differences, test_slice_matches_torch = op_tests(CASES)


def test_a_slice_reads_nothing_of_the_forward():
    g = trace(mnn.Sequential(mnn.Conv2d(5, 5, 1), FnModule(lambda x: x[:, 1:3])), SHAPE)
    (node,) = [n for n in g.nodes if n.op.name == "slice"]
    assert (node.op.saved_inputs, node.op.saved_outputs) == ((), ())
    assert node.path == "1" and node.outputs[0].shape == (2, 2, 4, 6)


# ------------------------------------------------------------- what it refuses
def _trace_inner(fn):
    return trace(mnn.Sequential(mnn.Identity(), mnn.Sequential(FnModule(fn))), SHAPE)


@pytest.mark.parametrize("fn,what", [
    (lambda x: x[:, [0, 2]], "a list (advanced indexing)"),
    (lambda x: x[:, np.array([0, 2])], "a ndarray (advanced indexing)"),
    (lambda x: x[:, x], "a Value (advanced indexing)"),
    (lambda x: x[:, True], "a bool (a boolean mask)"),
    (lambda x: x[:, 1.0], "a float (advanced indexing)"),
    (lambda x: x[:, ::-1], "a slice step of -1"),
    (lambda x: x[:, 0.5:2], "a float as a slice start"),
    (lambda x: x[..., 0, ...], "more than one '...'"),
    (lambda x: x[:, 0, 0, 0, 0], "5 indices (too many for a 4-d tensor)"),
    (lambda x: x[0], "a selection along the batch dimension"),
    (lambda x: x[1:], "a selection along the batch dimension"),
    (lambda x: x[None], "a selection along the batch dimension"),
], ids=["list", "array", "traced", "bool", "float", "negative_step", "float_bound", "two_ellipses", "too_many",
        "batch_int", "batch_slice", "batch_new_axis"])
def test_unsupported_indexing_names_the_module(fn, what):
    with pytest.raises(TracingError) as ei:
        _trace_inner(fn)
    msg = str(ei.value)
    assert msg.startswith("1.0: indexing ["), msg
    assert what in msg and "traced values support" in msg and "basic indexing" in msg, msg
    assert isinstance(ei.value, MinidnnError) and isinstance(ei.value, TypeError)


@pytest.mark.parametrize("fn,what", [
    (lambda x: x[:, 5], "index 5 is out of range for dimension 1 with size 5"),
    (lambda x: x[:, :, -5], "index -5 is out of range for dimension 2 with size 4"),
    (lambda x: x[:, 3:3], "the slice 3:3 of dimension 1 (size 5) selects nothing"),
])
def test_out_of_range_names_the_module(fn, what):
    with pytest.raises(ShapeError) as ei:
        _trace_inner(fn)
    msg = str(ei.value)
    assert msg.startswith("1.0 (slice): "), msg
    assert what in msg and str(SHAPE) in msg, msg
