"""The kit's kernel library against IREE's own codegen and PyTorch, op by op, on one GPU.

For every library kernel (kernels/*), one or more cases of a fixed size. Each case runs three
implementations of the same op on the same inputs:
- kit: the library kernel, called through its .vmfb (built with `--arch sm_90a,sm_80`);
- iree: IREE's codegen of the op written in linalg/tensor MLIR below (static shapes, compiled for
  sm_89, the newest CUDA target IREE 3.13 generates code for below sm_120);
- torch: the PyTorch op (cuBLAS for matmul, scaled_dot_product_attention with the flash backend).

Two numbers per implementation:
- device time: the kernels' own time per call, from Nsight Compute (`gpu__time_duration`, clocks
  left alone), summed over every kernel a call launches; all cases and implementations run in
  one process under ncu, a marker kernel between them;
- whole call: wall time of a synchronous call from Python, inputs already on the GPU (for kit and
  iree: output allocation, dispatch and wait through iree.runtime; for torch: the op and a
  synchronize). torch's CUDA-event time is recorded beside it.

Every case first checks that the three results agree.

    python benchmarks/kernels.py build BUILD          # here: kit modules + IREE codegen modules
    python benchmarks/kernels.py run BUILD OUT        # GPU machine: OUT/kernels.json, .md, .png
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from mlir_text import contraction, tensor_type, truncate

REPO = Path(__file__).resolve().parent.parent
ARCHS = "sm_90a,sm_80"
IREE_TARGET = "sm_89"
NCU_CALLS = 3  # profiled calls per case and implementation, after one warm-up call
MARKER = "kit_bench_marker"


# ---------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One op at one size. `inputs` are (shape, dtype) pairs; `scalars` trail them as-is."""

    name: str
    module: str  # kit module (kernels/<module>)
    function: str  # kit function
    inputs: tuple[tuple[tuple[int, ...], str], ...]
    torch_op: str  # key of TORCH_OPS
    mlir: str  # func.func @main of the same op for IREE's codegen
    flop: float = 0.0  # arithmetic work, for TFLOP/s (matrix ops)
    bytes: float = 0.0  # fewest bytes moved, for GB/s (memory-bound ops)
    scalars: tuple = field(default=())
    tol: float = 1e-5  # relative L2 difference allowed between implementations

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() else "_" for c in self.name).strip("_")


def _elementwise_mlir(n: int, body: str, args: int, scalar: bool = False) -> str:
    """A 1-D linalg.generic over `args` f32 inputs (and an f32 scalar %alpha)."""
    t = tensor_type((n,), "f32")
    ins = ", ".join(f"%a{i}" for i in range(args))
    params = ", ".join(f"%a{i}: {t}" for i in range(args)) + (", %alpha: f32" if scalar else "")
    maps = ", ".join(["affine_map<(d0) -> (d0)>"] * (args + 1))
    block = ", ".join(f"%x{i}: f32" for i in range(args))
    return f"""func.func @main({params}) -> {t} {{
  %e = tensor.empty() : {t}
  %r = linalg.generic {{indexing_maps = [{maps}], iterator_types = ["parallel"]}}
      ins({ins} : {", ".join([t] * args)}) outs(%e : {t}) {{
  ^bb0({block}, %o: f32):
{body}
  }} -> {t}
  return %r : {t}
}}"""


GELU_BODY = """    %c0 = arith.constant 0.5 : f32
    %c1 = arith.constant 1.0 : f32
    %k = arith.constant 0.7978845608028654 : f32
    %c3 = arith.constant 0.044715 : f32
    %x2 = arith.mulf %x0, %x0 : f32
    %x3 = arith.mulf %x2, %x0 : f32
    %t0 = arith.mulf %x3, %c3 : f32
    %t1 = arith.addf %x0, %t0 : f32
    %t2 = arith.mulf %t1, %k : f32
    %th = math.tanh %t2 : f32
    %t3 = arith.addf %th, %c1 : f32
    %t4 = arith.mulf %x0, %c0 : f32
    %g = arith.mulf %t4, %t3 : f32"""


def _bias_gelu_mlir(rows: int, cols: int) -> str:
    t, b = tensor_type((rows, cols), "f32"), tensor_type((cols,), "f32")
    return f"""func.func @main(%x: {t}, %bias: {b}) -> {t} {{
  %e = tensor.empty() : {t}
  %r = linalg.generic {{indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>,
      affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]}}
      ins(%x, %bias : {t}, {b}) outs(%e : {t}) {{
  ^bb0(%xi: f32, %bi: f32, %o: f32):
    %x0 = arith.addf %xi, %bi : f32
{GELU_BODY}
    linalg.yield %g : f32
  }} -> {t}
  return %r : {t}
}}"""


def _row_reduce_mlir(rows: int, cols: int, op: str, init: str) -> str:
    t, r = tensor_type((rows, cols), "f32"), tensor_type((rows,), "f32")
    return f"""func.func @main(%x: {t}) -> {r} {{
  %init = arith.constant {init} : f32
  %e = tensor.empty() : {r}
  %f = linalg.fill ins(%init : f32) outs(%e : {r}) -> {r}
  %s = linalg.reduce ins(%x : {t}) outs(%f : {r}) dimensions = [1]
    (%in: f32, %acc: f32) {{
      %v = {op} %in, %acc : f32
      linalg.yield %v : f32
    }}
  return %s : {r}
}}"""


def _argmax_mlir(rows: int, cols: int) -> str:
    t, rf, ri = tensor_type((rows, cols), "f32"), tensor_type((rows,), "f32"), tensor_type((rows,), "i32")
    return f"""func.func @main(%x: {t}) -> {ri} {{
  %ninf = arith.constant 0xFF800000 : f32
  %zero = arith.constant 0 : i32
  %ev = tensor.empty() : {rf}
  %ei = tensor.empty() : {ri}
  %fv = linalg.fill ins(%ninf : f32) outs(%ev : {rf}) -> {rf}
  %fi = linalg.fill ins(%zero : i32) outs(%ei : {ri}) -> {ri}
  %r:2 = linalg.generic {{indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>,
      affine_map<(d0, d1) -> (d0)>], iterator_types = ["parallel", "reduction"]}}
      ins(%x : {t}) outs(%fv, %fi : {rf}, {ri}) {{
  ^bb0(%in: f32, %v: f32, %i: i32):
    %j = linalg.index 1 : index
    %ji = arith.index_cast %j : index to i32
    %gt = arith.cmpf ogt, %in, %v : f32
    %nv = arith.select %gt, %in, %v : f32
    %ni = arith.select %gt, %ji, %i : i32
    linalg.yield %nv, %ni : f32, i32
  }} -> ({rf}, {ri})
  return %r#1 : {ri}
}}"""


def _softmax_mlir(rows: int, cols: int) -> str:
    t = tensor_type((rows, cols), "f32")
    return f"""func.func @main(%x: {t}) -> {t} {{
  %e = tensor.empty() : {t}
  %r = linalg.softmax dimension(1) ins(%x : {t}) outs(%e : {t}) -> {t}
  return %r : {t}
}}"""


def _transpose_mlir(rows: int, cols: int) -> str:
    t, u = tensor_type((rows, cols), "f32"), tensor_type((cols, rows), "f32")
    return f"""func.func @main(%x: {t}) -> {u} {{
  %e = tensor.empty() : {u}
  %r = linalg.transpose ins(%x : {t}) outs(%e : {u}) permutation = [1, 0]
  return %r : {u}
}}"""


def _matmul_mlir(m: int, n: int, k: int, dtype: str, out: str) -> str:
    a, b, c = tensor_type((m, k), dtype), tensor_type((k, n), dtype), tensor_type((m, n), "f32")
    text = f"""func.func @main(%a: {a}, %b: {b}) -> {tensor_type((m, n), out)} {{
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : {c}
  %f = linalg.fill ins(%zero : f32) outs(%e : {c}) -> {c}
  %acc = linalg.matmul ins(%a, %b : {a}, {b}) outs(%f : {c}) -> {c}
"""
    result = "acc"
    if out != "f32":
        trunc, result = truncate("acc", (m, n), out)
        text += trunc
    return text + f"  return %{result} : {tensor_type((m, n), out)}\n}}"


def _attention_mlir(b: int, h: int, s: int, d: int, dtype: str, causal: bool) -> str:
    """softmax(Q K^T / sqrt(d)) V in plain linalg: a contraction, a scale (and mask), a
    linalg.softmax, a rounding of P to the input type, a batch_matmul."""
    bh = b * h
    q4, q3 = tensor_type((b, h, s, d), dtype), tensor_type((bh, s, d), dtype)
    sf, sp, o3 = tensor_type((bh, s, s), "f32"), tensor_type((bh, s, s), dtype), tensor_type((bh, s, d), "f32")
    scale = 1.0 / np.sqrt(d)
    mask = (
        """    %i = linalg.index 1 : index
    %j = linalg.index 2 : index
    %future = arith.cmpi ugt, %j, %i : index
    %ninf = arith.constant 0xFF800000 : f32
    %sv = arith.select %future, %ninf, %sc : f32"""
        if causal
        else "    %sv = arith.addf %sc, %z : f32"
    )
    trunc_o, o_name = truncate("o", (bh, s, d), dtype)
    maps = [f"affine_map<(b, i, j, c) -> ({dims})>" for dims in ("b, i, c", "b, j, c", "b, i, j")]
    scores = contraction("scores", ("q", q3), ("k", q3), ("fs", sf), maps, ["parallel"] * 3 + ["reduction"], dtype)
    return f"""func.func @main(%q4: {q4}, %k4: {q4}, %v4: {q4}) -> {q4} {{
  %q = tensor.collapse_shape %q4 [[0, 1], [2], [3]] : {q4} into {q3}
  %k = tensor.collapse_shape %k4 [[0, 1], [2], [3]] : {q4} into {q3}
  %v = tensor.collapse_shape %v4 [[0, 1], [2], [3]] : {q4} into {q3}
  %z = arith.constant 0.0 : f32
  %es = tensor.empty() : {sf}
  %fs = linalg.fill ins(%z : f32) outs(%es : {sf}) -> {sf}
{scores}  %em = tensor.empty() : {sf}
  %scaled = linalg.generic {{indexing_maps = [affine_map<(b, i, j) -> (b, i, j)>, affine_map<(b, i, j) -> (b, i, j)>],
      iterator_types = ["parallel", "parallel", "parallel"]}} ins(%scores : {sf}) outs(%em : {sf}) {{
  ^bb0(%x: f32, %o: f32):
    %scale = arith.constant {scale:.10f} : f32
    %sc = arith.mulf %x, %scale : f32
{mask}
    linalg.yield %sv : f32
  }} -> {sf}
  %ew = tensor.empty() : {sf}
  %w = linalg.softmax dimension(2) ins(%scaled : {sf}) outs(%ew : {sf}) -> {sf}
  %ep = tensor.empty() : {sp}
  %p = linalg.generic {{indexing_maps = [affine_map<(b, i, j) -> (b, i, j)>, affine_map<(b, i, j) -> (b, i, j)>],
      iterator_types = ["parallel", "parallel", "parallel"]}} ins(%w : {sf}) outs(%ep : {sp}) {{
  ^bb0(%x: f32, %o: {dtype}):
    %c = arith.truncf %x : f32 to {dtype}
    linalg.yield %c : {dtype}
  }} -> {sp}
  %eo = tensor.empty() : {o3}
  %fo = linalg.fill ins(%z : f32) outs(%eo : {o3}) -> {o3}
  %o = linalg.batch_matmul ins(%p, %v : {sp}, {q3}) outs(%fo : {o3}) -> {o3}
{trunc_o}  %out = tensor.expand_shape %{o_name} [[0, 1], [2], [3]] output_shape [{b}, {h}, {s}, {d}] : {q3} into {q4}
  return %out : {q4}
}}"""


def _cases() -> list[Case]:
    n = 1 << 26
    vec = (((n,), "f32"),)
    cases = [
        Case("add 64M f32", "elementwise", "add", vec * 2, "add", _elementwise_mlir(n, "    %s = arith.addf %x0, %x1 : f32\n    linalg.yield %s : f32", 2), bytes=12 * n),
        Case("relu 64M f32", "elementwise", "relu", vec, "relu", _elementwise_mlir(n, "    %z = arith.constant 0.0 : f32\n    %s = arith.maximumf %x0, %z : f32\n    linalg.yield %s : f32", 1), bytes=8 * n),
        Case("gelu 64M f32", "elementwise", "gelu", vec, "gelu", _elementwise_mlir(n, GELU_BODY + "\n    linalg.yield %g : f32", 1), bytes=8 * n),
        Case("scale_add 64M f32", "elementwise", "scale_add", vec * 2, "scale_add", _elementwise_mlir(n, "    %p = arith.mulf %x0, %alpha : f32\n    %s = arith.addf %p, %x1 : f32\n    linalg.yield %s : f32", 2, scalar=True), bytes=12 * n, scalars=(1.5,)),
        Case("bias_gelu 8192x8192 f32", "elementwise", "bias_gelu", (((8192, 8192), "f32"), ((8192,), "f32")), "bias_gelu", _bias_gelu_mlir(8192, 8192), bytes=8 * 8192 * 8192),
        Case("row_sum 8192x8192 f32", "reduction", "row_sum", (((8192, 8192), "f32"),), "row_sum", _row_reduce_mlir(8192, 8192, "arith.addf", "0.0"), bytes=4 * 8192 * 8192),
        Case("row_max 8192x8192 f32", "reduction", "row_max", (((8192, 8192), "f32"),), "row_max", _row_reduce_mlir(8192, 8192, "arith.maximumf", "0xFF800000"), bytes=4 * 8192 * 8192),
        Case("row_argmax 8192x8192 f32", "argmax", "row_argmax", (((8192, 8192), "f32"),), "row_argmax", _argmax_mlir(8192, 8192), bytes=4 * 8192 * 8192, tol=0.0),
        Case("softmax 4096x4096 f32", "softmax", "row_softmax", (((4096, 4096), "f32"),), "softmax", _softmax_mlir(4096, 4096), bytes=8 * 4096 * 4096),
        Case("softmax 256x65536 f32", "softmax", "row_softmax", (((256, 65536), "f32"),), "softmax", _softmax_mlir(256, 65536), bytes=8 * 256 * 65536),
        Case("transpose 8192x8192 f32", "transpose", "transpose", (((8192, 8192), "f32"),), "transpose", _transpose_mlir(8192, 8192), bytes=8 * 8192 * 8192),
    ]
    for size in (4096, 8192):
        for dtype, out, fn in (("f16", "f16", "matmul_f16_f16"), ("bf16", "bf16", "matmul_bf16_bf16"), ("f16", "f32", "matmul_f16")):
            if size == 8192 and out == "f32":
                continue
            cases.append(Case(f"matmul {size}^3 {dtype}->{out}", "matmul", fn, (((size, size), dtype),) * 2, f"matmul_{out}",
                              _matmul_mlir(size, size, size, dtype, out), flop=2.0 * size**3, tol=3e-3 if out == "f16" else 1e-2))
    for (b, h, s, d, dtype, causal) in ((4, 16, 4096, 128, "f16", False), (4, 16, 4096, 128, "f16", True),
                                        (4, 16, 4096, 128, "bf16", False), (4, 32, 4096, 64, "f16", False)):
        fn = f"attention{'_causal' if causal else ''}_{dtype}"
        cases.append(Case(f"attention{' causal' if causal else ''} b{b} h{h} s{s} d{d} {dtype}", "attention", fn,
                          (((b, h, s, d), dtype),) * 3, "attention_causal" if causal else "attention",
                          _attention_mlir(b, h, s, d, dtype, causal), flop=4.0 * b * h * s * s * d / (2 if causal else 1),
                          tol=3e-3 if dtype == "f16" else 2e-2))
    return cases


CASES = _cases()


# ---------------------------------------------------------------------------- build


def build(out: Path) -> None:
    """Kit modules (kernels/* for sm_90a + sm_80) and one IREE codegen module per case."""
    sys.path.insert(0, str(REPO))
    import kitdispatch as kd
    from kitdispatch.iree.tools import find_iree_compile

    modules = sorted({c.module for c in CASES})
    kd.build_all([REPO / "kernels" / m for m in modules], kd.BuildOptions.create(ARCHS), out / "kit")
    iree_compile = find_iree_compile()
    (out / "iree").mkdir(parents=True, exist_ok=True)
    for case in CASES:
        src = out / "iree" / f"{case.slug}.mlir"
        src.write_text(case.mlir + "\n")
        t0 = time.perf_counter()
        subprocess.run([str(iree_compile), str(src), "--iree-hal-target-device=cuda", f"--iree-cuda-target={IREE_TARGET}",
                        "-o", str(src.with_suffix(".vmfb"))], check=True, timeout=1800)
        print(f"iree-compile {case.slug}: {time.perf_counter() - t0:.1f} s", flush=True)


# ---------------------------------------------------------------------------- run


def make_inputs(case: Case, seed: int = 0) -> list[np.ndarray]:
    import ml_dtypes

    rng = np.random.default_rng(seed)
    types = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
    return [rng.standard_normal(shape, dtype=np.float32).astype(types[dtype]) for shape, dtype in case.inputs]


TORCH_OPS = {
    "add": lambda F, x, y: x + y,
    "relu": lambda F, x: F.relu(x),
    "gelu": lambda F, x: F.gelu(x, approximate="tanh"),
    "scale_add": lambda F, x, y, alpha: alpha * x + y,
    "bias_gelu": lambda F, x, bias: F.gelu(x + bias, approximate="tanh"),
    "row_sum": lambda F, x: x.sum(1),
    "row_max": lambda F, x: x.amax(1),
    "row_argmax": lambda F, x: x.argmax(1).int(),
    "softmax": lambda F, x: F.softmax(x, 1),
    "transpose": lambda F, x: x.t().contiguous(),
    "matmul_f16": lambda F, a, b: a @ b,
    "matmul_bf16": lambda F, a, b: a @ b,
    "matmul_f32": lambda F, a, b: a @ b,  # cuBLAS f16 result: torch has no f16 x f16 -> f32 mm
    "attention": lambda F, q, k, v: F.scaled_dot_product_attention(q, k, v),
    "attention_causal": lambda F, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
}


class Runner:
    """The three implementations of every case, loaded once, inputs resident on the GPU."""

    def __init__(self, build_dir: Path):
        import iree.runtime as rt
        import torch
        import torch.nn.functional as F

        import kitdispatch

        self.rt, self.torch, self.F = rt, torch, F
        self.kit = {m: kitdispatch.load_module(build_dir / "kit" / m / f"{m}.vmfb") for m in {c.module for c in CASES}}
        self.build_dir = build_dir
        self.iree_config = rt.Config("cuda")

    def iree_function(self, case: Case):
        rt = self.rt
        ctx = rt.SystemContext(config=self.iree_config)
        vm = rt.VmModule.copy_buffer(self.iree_config.vm_instance, (self.build_dir / "iree" / f"{case.slug}.vmfb").read_bytes())
        ctx.add_vm_module(vm)
        return ctx.modules.module["main"]

    def calls(self, case: Case, inputs: list[np.ndarray]) -> dict:
        """name -> zero-argument callable that runs the op once and returns its result."""
        rt, torch = self.rt, self.torch
        kit_mod = self.kit[case.module]
        kit_fn = kit_mod.raw(case.function)
        kit_args = [rt.asdevicearray(kit_mod.hal_device, x) for x in inputs] + list(case.scalars)
        iree_fn = self.iree_function(case)
        iree_args = [rt.asdevicearray(self.iree_config.device, x) for x in inputs] + list(case.scalars)
        torch_args = [self._to_torch(x) for x in inputs] + list(case.scalars)
        op = TORCH_OPS[case.torch_op]
        F = self.F
        if case.torch_op.startswith("attention"):
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def torch_call():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return op(F, *torch_args)
        else:
            def torch_call():
                return op(F, *torch_args)
        return {"kit": lambda: kit_fn(*kit_args), "iree": lambda: iree_fn(*iree_args), "torch": torch_call}

    def _to_torch(self, x: np.ndarray):
        torch = self.torch
        if x.dtype.name == "bfloat16":
            return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).cuda()
        return torch.from_numpy(x).cuda()

    def to_numpy(self, value) -> np.ndarray:
        torch = self.torch
        if isinstance(value, torch.Tensor):
            return value.float().cpu().numpy() if value.is_floating_point() else value.cpu().numpy()
        host = value.to_host() if hasattr(value, "to_host") else np.asarray(value)
        return host.astype(np.float32) if host.dtype.kind == "f" or host.dtype.name == "bfloat16" else host


def agreement(case: Case, runner: Runner, calls: dict) -> dict:
    """Relative L2 difference of kit and iree against torch (0 for exact integer results)."""
    ref = runner.to_numpy(calls["torch"]())
    out = {}
    for name in ("kit", "iree"):
        got = runner.to_numpy(calls[name]())
        if case.tol == 0.0:
            out[name] = float(np.mean(got.astype(np.int64) != ref.astype(np.int64)))
        else:
            r64, g64 = ref.astype(np.float64), got.astype(np.float64)
            out[name] = float(np.linalg.norm(g64 - r64) / max(np.linalg.norm(r64), 1e-30))
    return out


def whole_call_us(call, sync, reps: int) -> float:
    call()
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def event_times_us(torch, call, reps: int, warmup: int = 1) -> list[float]:
    """Device time of each of `reps` calls on torch's stream (CUDA events), sorted."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        call()
        e.record()
        pairs.append((s, e))
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) * 1e3 for s, e in pairs)


def torch_event_us(torch, call, reps: int) -> float:
    return statistics.median(event_times_us(torch, call, reps))


def measure(build_dir: Path) -> list[dict]:
    runner = Runner(build_dir)
    torch = runner.torch
    rows = []
    for case in CASES:
        row = {"case": case.name, "flop": case.flop, "bytes": case.bytes}
        try:
            calls = runner.calls(case, make_inputs(case))
            agree = agreement(case, runner, calls)
            row["agreement_vs_torch"] = agree
            row["agrees"] = all(v <= max(case.tol, 1e-12) for v in agree.values())
            reps = 20 if case.flop > 1e12 else 50
            for name, call in calls.items():
                row[f"{name}_call_us"] = whole_call_us(call, torch.cuda.synchronize, reps)
            row["torch_event_us"] = torch_event_us(torch, calls["torch"], reps)
            print(f"{case.name:38s} call us: kit {row['kit_call_us']:9.1f}  iree {row['iree_call_us']:9.1f}  "
                  f"torch {row['torch_call_us']:9.1f} (events {row['torch_event_us']:9.1f})  vs torch {agree}", flush=True)
            del calls
        except Exception as exc:  # noqa: BLE001 - report the case and go on with the others
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            print(f"{case.name:38s} FAILED {row['error']}", flush=True)
        rows.append(row)
    return rows


def ncu_child(build_dir: Path) -> None:
    """Under ncu: for every case and implementation, one warm-up call, then NCU_CALLS calls
    between two marker kernels: the kernels between a pair of markers are that
    implementation's (none where it failed)."""
    import cupy as cp

    runner = Runner(build_dir)
    kernel = cp.RawKernel(f'extern "C" __global__ void {MARKER}() {{}}', MARKER)

    def marker():
        runner.torch.cuda.synchronize()
        kernel((1,), (1,), ())
        cp.cuda.Device().synchronize()

    for case in CASES:
        try:
            calls = runner.calls(case, make_inputs(case))
        except Exception:  # noqa: BLE001 - measure() reports it
            calls = {}
        for name in ("kit", "iree", "torch"):
            try:
                calls[name]()  # warm-up, before the marker
                warm = True
            except Exception:  # noqa: BLE001
                warm = False
            marker()
            try:
                for _ in range(NCU_CALLS if warm else 0):
                    calls[name]()
            except Exception:  # noqa: BLE001
                pass
            marker()
        del calls


def device_times(build_dir: Path, out_dir: Path) -> dict:
    """(case, implementation) -> {us, kernels}: ncu device time per call, all kernels summed."""
    ncu = shutil.which("ncu")
    if not ncu:
        print("ncu not found: no device times", flush=True)
        return {}
    res = subprocess.run(
        [ncu, "--clock-control", "none", "--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base",
         sys.executable, __file__, "ncu-child", str(build_dir)],
        capture_output=True, text=True, timeout=3000,
    )
    (out_dir / "kernels_ncu.csv").write_text(res.stdout)
    if res.returncode != 0:
        raise RuntimeError(f"ncu failed ({res.returncode}):\n{res.stderr[-4000:]}")
    kernels = []  # (name, ns) in launch order
    import csv

    for rec in csv.DictReader(line for line in res.stdout.splitlines() if line.startswith('"')):
        if rec.get("Metric Name") == "gpu__time_duration.sum":
            kernels.append((rec["Kernel Name"], float(rec["Metric Value"].replace(",", ""))))
    segments, current = [], None
    for name, ns in kernels:
        if not name.startswith(MARKER):
            if current is not None:
                current.append((name, ns))
        elif current is None:  # an opening marker
            current = []
        else:
            segments.append(current)
            current = None
    order = [(c.name, impl) for c in CASES for impl in ("kit", "iree", "torch")]
    if len(segments) != len(order):
        raise RuntimeError(f"expected {len(order)} ncu segments, got {len(segments)}")
    times = {}
    for (case, impl), seg in zip(order, segments):
        times[(case, impl)] = {
            "us": sum(ns for _, ns in seg) / NCU_CALLS / 1e3,
            "kernels_per_call": len(seg) / NCU_CALLS,
            "kernel_names": sorted({n for n, _ in seg}),
        }
    return times


def environment() -> dict:
    from environment import base

    import torch

    ncu = shutil.which("ncu")
    ncu_version = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1] if ncu else None
    return {
        **base("torch", "iree-base-runtime", gpu_fields="name,driver_version,clocks.max.sm,memory.total"),
        "cuda_runtime_torch": torch.version.cuda,
        "iree_codegen_target": IREE_TARGET,
        "kit_archs": ARCHS,
        "ncu": ncu_version,
    }


def rate(row: dict, us: float) -> str:
    if row["flop"]:
        return f"{row['flop'] / us / 1e6:.0f} TFLOP/s"
    return f"{row['bytes'] / us / 1e3:.0f} GB/s"


def table(rows: list[dict]) -> str:
    head = ("| op | kit | IREE codegen | torch | kit vs IREE | kit vs torch |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: |\n")
    lines = []
    for r in rows:
        k, i, t = r.get("kit_us"), r.get("iree_us"), r.get("torch_us")
        if k is None:
            continue
        lines.append(f"| {r['case']} | {k:.1f} us ({rate(r, k)}) | {i:.1f} us | {t:.1f} us ({rate(r, t)}) | "
                     f"{i / k:.2f}x | {t / k * 100:.0f}% |")
    return head + "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r.get("kit_us")]
    labels = [r["case"] for r in rows]
    y = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(rows) + 1.5))
    ax.barh(y - 0.2, [r["torch_us"] / r["kit_us"] for r in rows], 0.4, label="kit kernel")
    ax.barh(y + 0.2, [r["torch_us"] / r["iree_us"] for r in rows], 0.4, label="IREE codegen (sm_89)")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("speed relative to torch (torch device time / device time; > 1 is faster than torch)")
    ax.set_title("kitdispatch library kernels vs IREE codegen vs torch (device time, ncu)")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(build_dir: Path, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment()
    print(json.dumps(env), flush=True)
    rows = measure(build_dir)
    (out_dir / "kernels.json").write_text(json.dumps({"environment": env, "cases": rows}, indent=1) + "\n")
    times = device_times(build_dir, out_dir)
    for row in rows:
        for impl in ("kit", "iree", "torch"):
            t = times.get((row["case"], impl))
            if t:
                row[f"{impl}_us"] = t["us"]
                row[f"{impl}_kernels_per_call"] = t["kernels_per_call"]
                row[f"{impl}_kernel_names"] = t["kernel_names"]
    (out_dir / "kernels.json").write_text(json.dumps({"environment": env, "cases": rows}, indent=1) + "\n")
    md = table(rows)
    (out_dir / "kernels.md").write_text(f"{env}\n\n{md}")
    print(md, flush=True)
    if times:
        plot(rows, out_dir / "kernels.png")


def main() -> None:
    # Folder arguments only: "--help" (or any option) is a request for the usage, never a folder
    # to build into.
    args = sys.argv[1:]
    wanted = {"build": 1, "run": 2, "ncu-child": 1}
    if not args or args[0] not in wanted or len(args) != 1 + wanted[args[0]] or any(a.startswith("-") for a in args):
        raise SystemExit(__doc__)
    cmd, paths = args[0], [Path(a) for a in args[1:]]
    if cmd == "build":
        build(*paths)
    elif cmd == "run":
        run(*paths)
    else:
        ncu_child(*paths)


if __name__ == "__main__":
    main()
