"""linalg.matmul (models/ops/matmul.py): plain operands, zero fill or an accumulating kernel."""

from __future__ import annotations

import pytest
from conftest import (
    matmul_kernel,
    matmul_model,
    only,
    ops_of,
)

from kitdispatch.models.replace import decide


def test_matmul_hit_with_zero_fill():
    d = only(decide(ops_of(matmul_model()), [matmul_kernel(multiple_of={"k": 16})]))
    assert d.kernel is not None and d.paths == ((0,), (1,))


@pytest.mark.parametrize(
    "model, kernel, reason",
    [
        (matmul_model(init="1.0"), matmul_kernel(), "accumulates into linalg.fill of 1.000000e+00 : f32, not a zero fill"),
        (matmul_model(init=None), matmul_kernel(), "accumulates into tensor.empty, not a zero fill"),
        (matmul_model(transpose_b=True), matmul_kernel(), "transposed, broadcast or cast"),
        (matmul_model(k=250), matmul_kernel(multiple_of={"k": 16}), "k = 250 is not a multiple of 16"),
        (matmul_model(dtype="bf16"), matmul_kernel(), "element type: the op's input 0 is 512x250xbf16".replace("250", "256")),
    ],
    ids=["non-zero-accumulator", "undefined-accumulator", "transposed", "divisibility", "dtype"],
)
def test_matmul_near_misses(model, kernel, reason):
    d = only(decide(ops_of(model), [kernel]))
    assert d.kernel is None
    assert reason in d.reasons[0], d.reasons


def test_accumulating_kernel_takes_any_accumulator():
    d = only(decide(ops_of(matmul_model(init="1.0")), [matmul_kernel(access="inout")]))
    assert d.kernel is not None and d.paths == ((0,), (1,), (2,))
