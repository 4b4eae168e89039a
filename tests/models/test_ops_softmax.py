"""linalg.softmax (models/ops/softmax.py): which softmax ops a kernel takes, and why not."""

from __future__ import annotations

import pytest
from conftest import (
    only,
    ops_of,
    softmax_kernel,
    softmax_model,
)

from kitdispatch.models.replace import decide


def test_softmax_hit():
    d = only(decide(ops_of(softmax_model()), [softmax_kernel()]))
    assert d.kernel is not None and d.paths == ((0,),)
    assert d.op.function == "forward" and d.op.result.shape == (512, 1000)


@pytest.mark.parametrize(
    "model, kernel, reason",
    [
        (softmax_model(dtype="f16"), softmax_kernel(), "element type: the op's input 0 is 512x1000xf16"),
        (softmax_model(shape="8x512x1000", dim=2), softmax_kernel(), "rank: the op's input 0 is 8x512x1000xf32 (3-D)"),
        (softmax_model(dim=0), softmax_kernel(), "the op normalizes dimension 0, the kernel dimension 1"),
        (softmax_model(), softmax_kernel(cols=1024), "dimension 1 of the op's input 0 (512x1000xf32) is 1000, the kernel's x needs 1024"),
        (softmax_model(), softmax_kernel(max_size={"cols": 512}), "cols = 1000 is over the kernel's maximum 512"),
        (softmax_model(shape="512x?"), softmax_kernel(multiple_of={"cols": 8}), "cols is dynamic in the model"),
    ],
    ids=["dtype", "rank", "reduction-dim", "static-shape", "max-size", "dynamic-vs-limit"],
)
def test_softmax_near_misses(model, kernel, reason):
    d = only(decide(ops_of(model), [kernel]))
    assert d.kernel is None
    assert reason in d.reasons[0], d.reasons


def test_softmax_dimension_constraint_and_dynamic_sizes():
    # A kernel that says it normalizes dimension 0 takes the op that does.
    assert only(decide(ops_of(softmax_model(dim=0)), [softmax_kernel(dimension=0)])).kernel is not None
    # Dynamic sizes are fine where no limit needs them: the wrapper reads them at run time.
    assert only(decide(ops_of(softmax_model(shape="?x?")), [softmax_kernel()])).kernel is not None
