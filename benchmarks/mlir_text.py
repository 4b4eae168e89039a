"""MLIR text the benchmarks hand to IREE alone, written once for benchmarks/kernels.py and
benchmarks/gemm_iree.py: tensor types, a contraction accumulating in f32 (a matmul in any layout,
batched or not, as a linalg.generic) and the rounding of an f32 result to a narrower type."""

from __future__ import annotations


def tensor_type(shape: tuple[int, ...], dtype: str) -> str:
    """`tensor<AxBxT>` of a static shape."""
    return f"tensor<{'x'.join(map(str, shape))}x{dtype}>"


def contraction(result: str, lhs: tuple[str, str], rhs: tuple[str, str], acc: tuple[str, str], maps: list[str],
                iterators: list[str], dtype: str) -> str:
    """`%result` = `%acc` + sum over the reduction loops of extf(lhs) * extf(rhs): `lhs`, `rhs`
    and `acc` are (value, type) pairs, `dtype` the operands' element type, f32 the sum's."""
    (a, a_t), (b, b_t), (c, c_t) = lhs, rhs, acc
    return f"""  %{result} = linalg.generic {{indexing_maps = [{", ".join(maps)}],
      iterator_types = [{", ".join(f'"{i}"' for i in iterators)}]}}
      ins(%{a}, %{b} : {a_t}, {b_t}) outs(%{c} : {c_t}) {{
  ^bb0(%x: {dtype}, %y: {dtype}, %s: f32):
    %xf = arith.extf %x : {dtype} to f32
    %yf = arith.extf %y : {dtype} to f32
    %xy = arith.mulf %xf, %yf : f32
    %sum = arith.addf %s, %xy : f32
    linalg.yield %sum : f32
  }} -> {c_t}
"""


def truncate(value: str, shape: tuple[int, ...], dtype: str) -> tuple[str, str]:
    """MLIR that rounds an f32 tensor %`value` to `dtype`; (text, result name)."""
    f, o = tensor_type(shape, "f32"), tensor_type(shape, dtype)
    dims = ", ".join(f"d{i}" for i in range(len(shape)))
    amap = f"affine_map<({dims}) -> ({dims})>"
    par = ", ".join(['"parallel"'] * len(shape))
    return f"""  %te_{value} = tensor.empty() : {o}
  %t_{value} = linalg.generic {{indexing_maps = [{amap}, {amap}], iterator_types = [{par}]}}
      ins(%{value} : {f}) outs(%te_{value} : {o}) {{
  ^bb0(%in: f32, %out: {dtype}):
    %c = arith.truncf %in : f32 to {dtype}
    linalg.yield %c : {dtype}
  }} -> {o}
""", f"t_{value}"
