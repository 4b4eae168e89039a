"""replace.py: the per-op decision over the registry (first fitting kernel, contracts, sizes the
kernel's index parameters cannot hold)."""

from __future__ import annotations

import pytest
from conftest import (
    SOFTMAX_CU,
    matmul_kernel,
    matmul_model,
    only,
    ops_of,
    replaces_of,
    softmax_kernel,
    softmax_model,
)

from kitdispatch import Buffer, Kernel, ManifestError, Scalar, TensorType
from kitdispatch.describe.index_expr import IndexExpr
from kitdispatch.models.replace import check_kernel, decide


def test_first_fitting_kernel_wins_and_every_misfit_says_why():
    kernels = [softmax_kernel(dtype="f16"), softmax_kernel(max_size={"cols": 4096})]
    kernels[1] = Kernel.create(
        "row_softmax", SOFTMAX_CU, kernels[1].params, workgroup_size=[256], workgroup_count=["ceildiv(rows, 32) + 1024"],
        function="softmax_big", replaces=kernels[1].replaces,
    )
    d = only(decide(ops_of(softmax_model()), kernels))
    assert d.kernel.function == "softmax_big"
    miss = only(decide(ops_of(softmax_model(dtype="f64")), kernels))
    assert len(miss.reasons) == 2


@pytest.mark.parametrize(
    "kernel, message",
    [
        (lambda: Kernel.create(
            "scale", SOFTMAX_CU, [Buffer("x", "in", TensorType("f32", ("n",))), Buffer("y", "out", TensorType("f32", ("n",))),
                                  Scalar("alpha", "f32")],
            workgroup_size=[64], workgroup_count=["ceildiv(n, 64)"], replaces=["linalg.softmax"]),
         "needs scalar argument(s) alpha, which linalg.softmax does not give"),
        (lambda: matmul_kernel(b="f16[m,n]"), "its shapes must read [m,k] x [k,n] -> [m,n]"),
        (lambda: softmax_kernel(dimension=2), "replace_when dimension 2 is not a dimension of its 2-D input"),
    ],
    ids=["scalar-argument", "b-of-other-sizes", "dimension-out-of-range"],
)
def test_kernels_that_cannot_stand_for_the_op(kernel, message):
    k = kernel()
    with pytest.raises(ManifestError) as err:
        check_kernel(k, k.replaces.ops[0])
    assert message in err.value.render()


@pytest.mark.parametrize(
    "model, kernel, reason",
    [
        (softmax_model(shape="2x2147483648"), softmax_kernel(),
         "size: cols = 2147483648 does not fit the kernel's i32 parameter cols (-2147483648 to 2147483647)"),
        (softmax_model(shape="2147483648x2"), softmax_kernel(),
         "size: rows = 2147483648 does not fit the kernel's i32 parameter rows"),
        (matmul_model(m=16, k=4294967296, n=16), matmul_kernel(),
         "size: k = 4294967296 does not fit the kernel's i32 parameter k"),
    ],
    ids=["softmax-cols", "softmax-rows", "matmul-k"],
)
def test_model_sizes_beyond_the_kernels_index_parameters_are_kept(model, kernel, reason):
    """A dimension the kernel's `int` cannot hold would reach it wrapped: the op is kept, with
    the reason, instead of being replaced."""
    d = only(decide(ops_of(model), [kernel]))
    assert d.kernel is None
    assert reason in d.reasons[0], d.reasons


def test_model_sizes_through_a_value_expression_are_checked():
    """A scalar whose value is an expression over the sizes (`value = "rows * 2"`) is checked too."""
    kernel = Kernel.create(
        "row_softmax", SOFTMAX_CU,
        [Buffer("x", "in", TensorType("f32", ("rows", "cols"))), Buffer("out", "out", TensorType("f32", ("rows", "cols"))),
         Scalar("rows", "i32", IndexExpr.parse("rows * 2", "rows")), Scalar("cols", "i32")],
        workgroup_size=[256], workgroup_count=["ceildiv(rows, 32) + 1024"], replaces=replaces_of("linalg.softmax"),
    )
    assert only(decide(ops_of(softmax_model(shape="1073741823x8")), [kernel])).kernel is not None
    d = only(decide(ops_of(softmax_model(shape="1073741824x8")), [kernel]))
    assert d.kernel is None and "size: rows = rows * 2 = 2147483648 does not fit" in d.reasons[0]
