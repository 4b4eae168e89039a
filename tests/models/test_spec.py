"""spec.py: the kernels' symbols for the transform spec (built by the build pipeline) and the spec."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest
from conftest import write_kernel_project

from kitdispatch import BuildOptions, load_manifest
from kitdispatch.errors import KitError, ManifestError
from kitdispatch.iree.tools import find_tool
from kitdispatch.models.ops.base import Call, Constant, OpFacts, Operand, Reshape, TensorFacts
from kitdispatch.models.pipeline import _mark
from kitdispatch.models.replace import COVERED_ATTRIBUTE, MARK_ATTRIBUTE, Decision, replacing_kernels
from kitdispatch.models.spec import SPEC_PIPELINE, adapter_lines, check_all_replaced, kernel_symbols, render_spec


def test_a_replacing_kernel_whose_code_settles_other_roles_is_refused(tmp_path):
    """Model ops are matched against the kernels as described: a function that the compiled
    code changes (out -> inout here) must not be spliced in as if it had not changed."""
    cu = r"""
    extern "C" __global__ void k(const float* x, float* out, int rows, int cols) {
      int i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < rows * cols) out[i] += x[i];
    }"""
    toml = ('[[kernels]]\nname = "k"\nsource = "k.cu"\nworkgroup_size = [64]\nworkgroup_count = ["ceildiv(rows * 4, 64)"]\n'
            'shapes = { x = "f32[rows,cols]", out = "f32[rows,cols]" }\nreplaces = ["linalg.softmax"]\n')
    spec = load_manifest(write_kernel_project(tmp_path / "src", cu, toml))
    kernels = list(replacing_kernels(spec))  # as described: x -> out
    with pytest.raises(ManifestError, match=r"kernel 'k': its compiled code gives its non-const pointers other roles.*"
                                            r"\(f32\[rows,cols\], f32\[rows,cols\]\) -> \(f32\[rows,cols\]\), not \(f32\[rows,cols\]\) ->"):
        kernel_symbols(spec, kernels, BuildOptions.create("sm_80"), tmp_path)


# ------------------------------------------------------------------ calls: paths, reshapes, constants, marked users

SCALE_CU = r"""
extern "C" __global__ void scale_rows(const float* x, float* out, float alpha, int rows, int cols) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < rows * cols) out[i] = alpha * x[i];
}"""
SCALE_TOML = ('[[kernels]]\nname = "scale_rows"\nsource = "k.cu"\nworkgroup_size = [64]\nworkgroup_count = ["ceildiv(rows * cols, 64)"]\n'
              'params = [{ name = "x", in = "f32[rows,cols]" }, { name = "out", out = "f32[rows,cols]" }, { name = "alpha", scalar = "f32" },\n'
              '  { name = "rows", scalar = "i32" }, { name = "cols", scalar = "i32" }]\nreplaces = ["linalg.softmax"]\n')
# negf, then a scale by 2.5: the call reads x from the scale's producer's operand, the anchor is
# the negf (marked 1 user down: the scale), x [2, 3, 4, 8] runs as rows [24, 8].
CHAIN_MODEL = """
#id = affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>
util.func public @f(%x: tensor<2x3x4x8xf32>) -> tensor<2x3x4x8xf32> {
  %e = tensor.empty() : tensor<2x3x4x8xf32>
  %n = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%x : tensor<2x3x4x8xf32>) outs(%e : tensor<2x3x4x8xf32>) {
    ^bb0(%a: f32, %o: f32):
      %v = arith.negf %a : f32
      linalg.yield %v : f32
  } -> tensor<2x3x4x8xf32>
  %c = arith.constant 2.5 : f32
  %s = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel", "parallel", "parallel"]}
      ins(%n : tensor<2x3x4x8xf32>) outs(%e : tensor<2x3x4x8xf32>) {
    ^bb0(%a: f32, %o: f32):
      %v = arith.mulf %a, %c : f32
      linalg.yield %v : f32
  } -> tensor<2x3x4x8xf32>
  util.return %s : tensor<2x3x4x8xf32>
}
"""


@dataclasses.dataclass(frozen=True)
class _NoFacts:
    summary = None

    def to_json(self) -> dict:
        return {}


def test_a_call_through_paths_reshapes_constants_and_a_marked_user_replaces_the_chain(tmp_path):
    """The whole call mechanism on real iree-opt: the op one user down is marked, the anchor
    covered, the kernel reads x from a producer's operand, collapsed to rows and expanded back,
    with alpha a constant of the adapter; afterwards neither generic is left."""
    from iree.compiler import ir

    spec = load_manifest(write_kernel_project(tmp_path / "src", SCALE_CU, SCALE_TOML))
    [kernel] = spec.kernels
    rows = Reshape(((0, 1, 2), (3,)))
    call = Call((Operand((0, 0), rows), Constant("f32", "2.500000e+00")), result=rows, marked=1)
    t = TensorFacts("f32", (2, 3, 4, 8))
    decision = Decision(OpFacts("linalg.softmax", "f", "here", (t,), t, t, _NoFacts()), kernel, call)
    stage = tmp_path / "stage"
    stage.mkdir()
    _, symbols = kernel_symbols(spec, [kernel], BuildOptions.create("sm_80"), stage)
    context = ir.Context()
    module = ir.Module.parse(CHAIN_MODEL, context)
    generics = [op.operation for op in module.body.operations[0].regions[0].blocks[0].operations if op.operation.name == "linalg.generic"]
    _mark(generics[0], decision, context)
    assert COVERED_ATTRIBUTE in generics[0].attributes and MARK_ATTRIBUTE in generics[1].attributes
    (stage / "marked.mlir").write_text(module.operation.get_asm())
    (stage / "spec.mlir").write_text(render_spec("p", "m", [kernel], [decision], symbols))
    adapter = adapter_lines(decision)
    assert any("tensor.collapse_shape %x0 [[0, 1, 2], [3]] : tensor<2x3x4x8xf32> into tensor<24x8xf32>" in line for line in adapter["body"])
    assert any("arith.constant 2.500000e+00 : f32" in line for line in adapter["body"])
    assert any("tensor.expand_shape" in line and "output_shape [2, 3, 4, 8]" in line for line in adapter["body"])
    subprocess.run([find_tool("iree-opt"), str(stage / "marked.mlir"), f"--pass-pipeline={SPEC_PIPELINE.format(spec=stage / 'spec.mlir')}",
                    "-o", str(stage / "replaced.mlir")], check=True, capture_output=True, timeout=300)
    replaced = (stage / "replaced.mlir").read_text()
    assert "linalg.generic" not in replaced and "arith.negf" not in replaced  # both gone, the producer's input passed
    check_all_replaced(stage / "replaced.mlir", [decision], symbols.executables, stage)


def test_a_covered_op_left_behind_fails_the_build(tmp_path):
    """The check after the spec: an op a replacement takes in that is still there (the kind
    misjudged its users) stops the build instead of computing twice."""
    from iree.compiler import ir

    module = ir.Module.parse(CHAIN_MODEL, ir.Context())
    first = next(op.operation for op in module.body.operations[0].regions[0].blocks[0].operations if op.operation.name == "linalg.generic")
    first.attributes[COVERED_ATTRIBUTE] = ir.StringAttr.get("x", module.context)
    (tmp_path / "replaced.mlir").write_text(module.operation.get_asm())
    with pytest.raises(KitError, match=r"left 1 marked op\(s\) in place"):
        check_all_replaced(tmp_path / "replaced.mlir", [], (), tmp_path)
