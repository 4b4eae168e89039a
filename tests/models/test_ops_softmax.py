"""linalg.softmax (models/ops/softmax.py): which softmax ops a kernel takes, and why not."""

from __future__ import annotations

import pytest
from conftest import (
    SOFTMAX_CU,
    dump_module,
    iree_dispatches,
    needs_iree_compile,
    only,
    ops_of,
    softmax_kernel,
    softmax_model,
)

from kitdispatch import BuildOptions
from kitdispatch.models.ops.base import Call, Operand, Reshape
from kitdispatch.models.pipeline import build_model
from kitdispatch.models.replace import decide


def test_softmax_hit():
    d = only(decide(ops_of(softmax_model()), [softmax_kernel()]))
    assert d.kernel is not None and d.paths == ((0,),)
    assert d.op.function == "forward" and d.op.result.shape == (512, 1000)


@pytest.mark.parametrize(
    "model, kernel, reason",
    [
        (softmax_model(dtype="f16"), softmax_kernel(), "element type: the op's input 0 is 512x1000xf16"),
        (softmax_model(shape="1000", dim=0), softmax_kernel(), "rank: the op's input 0 is 1000xf32 (1-D)"),
        (softmax_model(shape="8x512x1000", dim=1), softmax_kernel(), "the op normalizes dimension 1 of its 3, not the last"),
        (softmax_model(shape="8x512x1000", dim=2), softmax_kernel(dimension=0), "the op is 3-D and the kernel (2-D) normalizes dimension 0"),
        (softmax_model(shape="8x512x1000", dim=2), softmax_kernel(cols=1024), "dimension 1 of the op's input 0 (4096x1000xf32) is 1000"),
        (softmax_model(dim=0), softmax_kernel(), "the op normalizes dimension 0, the kernel dimension 1"),
        (softmax_model(), softmax_kernel(cols=1024), "dimension 1 of the op's input 0 (512x1000xf32) is 1000, the kernel's x needs 1024"),
        (softmax_model(), softmax_kernel(max_size={"cols": 512}), "cols = 1000 is over the kernel's maximum 512"),
        (softmax_model(shape="512x?"), softmax_kernel(multiple_of={"cols": 8}), "cols is dynamic in the model"),
    ],
    ids=["dtype", "rank", "4d-not-last", "3d-kernel-dim0", "3d-collapsed-size", "reduction-dim", "static-shape", "max-size", "dynamic-vs-limit"],
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


@pytest.mark.parametrize("shape", ["8x512x1000", "2x4x128x128", "?x8x64x64"])
def test_softmax_over_the_last_dim_of_any_rank_is_rows(shape):
    """A [b, h, s, s] softmax is b*h*s rows of the 2-D kernel: the input collapsed, the result
    expanded back (dynamic sizes read off the input, argument 0)."""
    rank = len(shape.split("x"))
    d = only(decide(ops_of(softmax_model(shape=shape, dim=rank - 1)), [softmax_kernel()]))
    assert d.kernel is not None, d.reasons
    groups = (tuple(range(rank - 1)), (rank - 1,))
    assert d.call == Call((Operand((0,), Reshape(groups)),), result=Reshape(groups, sizes_from=0), variant="_rows")


@needs_iree_compile
@pytest.mark.parametrize("shape", ["2x4x128x128", "?x8x64x64"])
def test_softmax_rows_build(tmp_path, shape):
    """A 4-D softmax (static, or with a dynamic batch) built with the library's row softmax:
    the adapter collapses the input to rows and expands the result back (dynamic sizes read
    off the input), and IREE's softmax dispatch is gone."""
    model = tmp_path / "sm.mlir"
    model.write_text(softmax_model(shape=shape, dim=3))
    result = build_model(SOFTMAX_CU.parent, model, BuildOptions.create("sm_90"), tmp_path / "out", library=False, with_baseline=True)
    [replaced] = result.replaced
    assert replaced.kernel.name == "row_softmax" and replaced.call.variant == "_rows"
    spec = result.spec.read_text()
    assert "tensor.collapse_shape" in spec and "tensor.expand_shape" in spec
    assert "row_softmax" in dump_module(result.vmfb)
    assert iree_dispatches(result.baseline_vmfb, "softmax") and not iree_dispatches(result.vmfb, "softmax")
