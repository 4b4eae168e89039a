"""IREE's own codegen at the GEMM benchmark's shapes: one module with a function per shape, built
where iree-compile is, for benchmarks/gemm.py to time beside the kit and cuBLAS in one run:

    python benchmarks/gemm_iree.py OUT.vmfb [--arch sm_90a]      # the build machine
    python benchmarks/gemm.py OBJECT_DIR OUT.json --iree OUT.vmfb  # the GPU machine

Each function computes what a model's matmul is at IREE's input: f16 or bf16 operands, f32
accumulation (linalg.matmul into f32), then the rounding to the operand type, so IREE fuses the
truncation into its matmul dispatch as it does in models. Layouts as gemm.py's: "nt" (B given
[n, k], nn.Linear's weight) and "nn"; batch matmuls as linalg.batch_matmul / a generic. Compiled
with the flags a model baseline gets (kitdispatch.iree.tools.target_flags for the codegen
target the kit picks for --arch): IREE alone, as users get it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "kernels" / "matmul"))
from mlir_text import contraction, tensor_type, truncate


def function_name(kind: str, layout: str, dtype: str, batch: int, m: int, n: int, k: int) -> str:
    """The name gemm.py looks up for a shape (IREE's dispatches of it start with it)."""
    return f"{kind}_{layout}_{dtype}_b{batch}_{m}x{n}x{k}"


def shapes() -> list[tuple[str, str, str, int, int, int, int]]:
    """(kind, layout, dtype, batch, m, n, k): what gemm.py's step_time times in f16."""
    from gemm_shapes import attention_shapes, model_shapes, square_shapes

    rows = [("matmul", "nt", "f16", 1, m, n, k) for _, m, n, k in model_shapes()]
    rows += [("matmul", layout, dtype, 1, s, s, s) for dtype, s, layout in square_shapes() if dtype == "f16"]  # bf16: no numpy type to pass
    rows += [("bmm", layout, "f16", b, m, n, k) for _, layout, b, m, n, k in attention_shapes()]
    return rows


def function_mlir(kind: str, layout: str, dtype: str, batch: int, m: int, n: int, k: int) -> str:
    lead = (batch,) if kind == "bmm" else ()
    a_t = tensor_type((*lead, m, k), dtype)
    b_t = tensor_type((*lead, n, k) if layout == "nt" else (*lead, k, n), dtype)
    acc_t, out_t = tensor_type((*lead, m, n), "f32"), tensor_type((*lead, m, n), dtype)
    d = "d0, d1, d2, d3" if lead else "d0, d1, d2"
    bd = "d0, " if lead else ""
    i, j, kk = ("d1", "d2", "d3") if lead else ("d0", "d1", "d2")
    b_map = f"({bd}{j}, {kk})" if layout == "nt" else f"({bd}{kk}, {j})"
    maps = [f"affine_map<({d}) -> ({bd}{i}, {kk})>", f"affine_map<({d}) -> {b_map}>", f"affine_map<({d}) -> ({bd}{i}, {j})>"]
    product = contraction("mm", ("a", a_t), ("b", b_t), ("acc", acc_t), maps, ["parallel"] * (len(lead) + 2) + ["reduction"], dtype)
    rounding, out = truncate("mm", (*lead, m, n), dtype)
    return f"""
func.func @{function_name(kind, layout, dtype, batch, m, n, k)}(%a: {a_t}, %b: {b_t}) -> {out_t} {{
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : {acc_t}
  %acc = linalg.fill ins(%zero : f32) outs(%empty : {acc_t}) -> {acc_t}
{product}{rounding}  return %{out} : {out_t}
}}"""


def build(out: Path, arch: str) -> None:
    from kitdispatch.compile.archs import Arch
    from kitdispatch.iree.tools import choose_codegen_target, find_tool, target_flags

    codegen = choose_codegen_target([Arch.parse(arch)]).target
    text = "module {" + "".join(function_mlir(*s) for s in dict.fromkeys(shapes())) + "\n}\n"
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "gemm_iree.mlir"
        source.write_text(text)
        argv = [find_tool("iree-compile"), str(source), *target_flags(codegen), "-o", str(out)]
        print("$", " ".join(argv), flush=True)
        subprocess.run(argv, check=True, timeout=3600)
    print(f"built {out}: {len(dict.fromkeys(shapes()))} functions, IREE codegen target {codegen.name}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", default="sm_90a")
    args = parser.parse_args()
    build(args.out, args.arch)


if __name__ == "__main__":
    main()
