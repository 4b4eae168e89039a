"""Counting an op's readers (models/ops/base.py:readers), on which "IREE fuses its one reader"
decisions rest. Keyed by id() the count was wrong at random: each `.operation` is a fresh
Python object freed at once, so two readers could share a recycled id and count as one."""

from __future__ import annotations

import pytest

ir = pytest.importorskip("iree.compiler.ir")

from kitdispatch.models.ops.base import fused_consumer, readers  # noqa: E402

TWO_READERS = """
#map = affine_map<(d0, d1) -> (d0, d1)>
#t = affine_map<(d0, d1) -> (d1, d0)>
func.func @f(%x: tensor<8x16xf32>) -> (tensor<16x8xf32>, tensor<8x16xf32>) {
  %e = tensor.empty() : tensor<16x8xf32>
  %0 = linalg.generic {indexing_maps = [#t, #map], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<8x16xf32>) outs(%e : tensor<16x8xf32>) {
  ^bb0(%in: f32, %out: f32):
    linalg.yield %in : f32
  } -> tensor<16x8xf32>
  return %0, %x : tensor<16x8xf32>, tensor<8x16xf32>
}
"""


def argument_of(text: str):
    context = ir.Context()
    module = ir.Module.parse(text, context)
    function = module.body.operations[0]
    return context, module, function.regions[0].blocks[0].arguments[0]


def test_two_readers_count_as_two_every_time():
    context, module, x = argument_of(TWO_READERS)
    for _ in range(200):  # the id() form got this wrong in most tries
        assert sorted(op.name for op in readers(x)) == ["func.return", "linalg.generic"]


def test_a_value_with_a_second_reader_has_no_fused_consumer():
    context, module, x = argument_of(TWO_READERS)
    assert all(fused_consumer(x) is None for _ in range(200))


def test_one_reader_read_twice_counts_once():
    text = TWO_READERS.replace("return %0, %x", "return %0, %0").replace(
        "(tensor<16x8xf32>, tensor<8x16xf32>)", "(tensor<16x8xf32>, tensor<16x8xf32>)"
    ).replace(": tensor<16x8xf32>, tensor<8x16xf32>\n}", ": tensor<16x8xf32>, tensor<16x8xf32>\n}")
    context, module, x = argument_of(text)
    assert [op.name for op in readers(x)] == ["linalg.generic"]
    assert fused_consumer(x) == "linalg.generic {}"
