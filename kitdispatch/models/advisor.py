"""The advisor behind `kitdispatch profile`: what each dispatch computes, how close it runs to the
GPU's peak, and which library kernel stands in for it, with the saving.

Pure functions over what a profile measured (compare.py's DispatchTime rows), the model record
(the replaced and kept ops with their types) and, where `kitdispatch tune` wrote one, the tune
record. Nothing here runs a tool.

What a dispatch computes is read from its name. IREE 3.13 names a dispatch
`{function}_dispatch_{N}_{summary}` (Flow's AnnotateDispatchesPass; `$` becomes `_` in the
kernel names Nsight Compute reports). The summary names the dispatch's costliest op:
- a linalg op: `{prefix}_{loop ranges}_{element types}`: the prefix is the named op
  (`matmul`, `batch_matmul`, ...) or, for a `linalg.generic`, a category (`elementwise`,
  `elementwise_transpose`, `elementwise_broadcast`, `transpose`, `matvec_like`, `matmul_like`,
  `contract`, `conv`, `reduction`, ...); loop ranges are the op's static loop ranges (`D`:
  dynamic), so a matmul is MxNxK and a batch_matmul BxMxNxK; the types are every operand's
  element type in order, outs included, collapsed to one where all are the same;
- a softmax or a LinalgExt op: `{op}_{shape of its largest tensor}x{type}`, then `_{op}` of
  its one user where it has one (`softmax_8x12x512x512xf32_generic`); but an
  `iree_linalg_ext.attention` is `attention_{its loop ranges}`, no types (iree-compile 3.13 names
  Q, K, V of 8x512x64xf16 `attention_8x512x64x64x512`: batch, sq, dv, d, sk in its maps' order);
- `slow_memcpy` for a dispatch that only copies; `unpack_` / `_pack` around a summary.
A kit kernel keeps its own export name (the pass skips external executables): the report's
`kernel_entry`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kitdispatch.describe.model_record import ModelRecord, ModelTensor
from kitdispatch.describe.probe_record import TuneEntry

# --------------------------------------------------------------------------- names


# Element types as IREE prints them -> bytes (i1 is stored as a byte).
ELEMENT_BYTES = {
    "f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "i1": 1, "index": 8,
    "f8E4M3FN": 1, "f8E5M2": 1, "f8E4M3FNUZ": 1, "f8E5M2FNUZ": 1, "ui8": 1, "ui32": 4, "si32": 4,
}
# Named ops and generic categories whose every loop point is one multiply-add (2 FLOPs).
CONTRACTIONS = {
    "matmul", "batch_matmul", "matmul_transpose_a", "matmul_transpose_b", "batch_matmul_transpose_a",
    "batch_matmul_transpose_b", "matvec", "vecmat", "batch_matvec", "batch_vecmat", "matmul_like", "matvec_like",
    "contract", "mmt4d", "batch_mmt4d", "batch_reduce_matmul", "conv",
}
_RANGES = re.compile(r"(?:\d+|D)(?:x(?:\d+|D))*")
_TYPE = r"(?:[a-z]+\d+[A-Za-z0-9]*|index)"
_TYPES = re.compile(rf"{_TYPE}(?:x{_TYPE})*")
_SHAPED = re.compile(rf"((?:(?:\d+|D)x)*)({_TYPE})")  # LinalgExt's main tensor: 8x12x512x512xf32
_DISPATCH = re.compile(r"^(?P<function>.+?)_dispatch_(?P<ordinal>\d+)(?:_(?P<summary>.+))?$")


@dataclass(frozen=True)
class DispatchOp:
    """What a dispatch computes, as its name says: `kind` is the op or the generic's category
    ("kit kernel" for a kit export, "unknown" where the name says nothing); `loops` its loop
    ranges (a LinalgExt op: its largest tensor's shape; None: dynamic); `dtypes` the element
    types the name lists; `consumer` the op fused after a softmax/LinalgExt op."""

    kind: str
    loops: tuple[int | None, ...] = ()
    dtypes: tuple[str, ...] = ()
    consumer: str | None = None
    shaped: bool = False  # loops are a tensor's shape (LinalgExt, softmax), not a linalg op's loops

    @property
    def text(self) -> str:
        shape = "x".join("?" if d is None else str(d) for d in self.loops)
        parts = [self.kind.replace("_", " ") if self.kind != "kit kernel" else self.kind, shape, "x".join(self.dtypes)]
        after = f" then {self.consumer}" if self.consumer else ""
        return " ".join(p for p in parts if p) + after

    def to_json(self) -> dict:
        return {"kind": self.kind, "loops": list(self.loops), "dtypes": list(self.dtypes), "consumer": self.consumer, "text": self.text}


def parse_dispatch(name: str, kit_kernels: Iterable[str] = ()) -> DispatchOp:
    """The op a dispatch named `name` computes (IREE's naming, module docstring). A name in
    `kit_kernels` (the record's kernel entries) is a kit kernel; a name IREE did not make is
    "unknown"."""
    if name in set(kit_kernels):
        return DispatchOp("kit kernel")
    m = _DISPATCH.match(name)
    if m is None or not m["summary"]:
        return DispatchOp("unknown")
    return parse_summary(m["summary"])


def parse_summary(summary: str) -> DispatchOp:
    """The part of a dispatch name after `_dispatch_N_`."""
    summary = summary.removeprefix("unpack_").removesuffix("_pack")
    tokens = summary.split("_")
    for i, token in enumerate(tokens[1:], start=1):
        prefix = "_".join(tokens[:i])
        if _RANGES.fullmatch(token) and i + 1 < len(tokens) and _TYPES.fullmatch(tokens[i + 1]):
            rest = tokens[i + 2:]
            return DispatchOp(prefix, _loops(token), tuple(tokens[i + 1].split("x")), "_".join(rest) or None)
        if _RANGES.fullmatch(token) and i + 1 == len(tokens):
            return DispatchOp(prefix, _loops(token))
        shaped = _SHAPED.fullmatch(token)
        if shaped and (shaped[1] or shaped[2] in ELEMENT_BYTES):  # `pack_f32`: a type alone; `mmt4d` is no type
            dims = _loops(shaped[1].rstrip("x")) if shaped[1] else ()
            user = "_".join(tokens[i + 1:])  # the op's one user: the dispatch's store is no fused op
            return DispatchOp(prefix, dims, (shaped[2],), None if user in ("", "dispatch_tensor_store") else user, shaped=True)
    return DispatchOp(summary)


def _loops(text: str) -> tuple[int | None, ...]:
    return tuple(None if d == "D" else int(d) for d in text.split("x"))


def unnumbered(dispatch: str) -> str:
    """A dispatch's name without its ordinal, which shifts when another dispatch goes."""
    return re.sub(r"_dispatch_\d+_", "_dispatch_", dispatch)


# --------------------------------------------------------------------------- work


@dataclass(frozen=True)
class Work:
    """What one run of an op does: FLOPs (None: not counted, the op is bound by memory) and
    bytes moved. `bytes_exact` False: the name gives a lower bound (fused operands it does not
    name, broadcast inputs, how many operands share a collapsed type)."""

    flops: float | None
    bytes: float | None
    bytes_exact: bool = False

    def __add__(self, other: Work) -> Work:
        def plus(a: float | None, b: float | None) -> float | None:
            return None if a is None and b is None else (a or 0.0) + (b or 0.0)

        return Work(plus(self.flops, other.flops), plus(self.bytes, other.bytes), self.bytes_exact and other.bytes_exact)


NO_WORK = Work(None, None, True)


def element_bytes(dtype: str) -> int | None:
    return ELEMENT_BYTES.get(dtype)


def dispatch_work(op: DispatchOp) -> Work:
    """FLOPs and bytes of a dispatch's named op from its name: contractions 2 FLOPs a loop
    point (matmul 2*M*N*K, batch 2*B*M*N*K, conv 2 * every loop); everything else none. Bytes:
    the operands and results the name implies, a lower bound except for a plain matmul or
    batch_matmul (the fused producers and consumers a dispatch holds have operands the name
    does not list)."""
    if not op.loops or any(d is None for d in op.loops) or op.kind in ("kit kernel", "unknown"):
        return Work(None, None)
    loops = [int(d) for d in op.loops]
    sizes = [element_bytes(t) for t in op.dtypes]
    if any(s is None for s in sizes) or not sizes:
        sizes = []
    points = math.prod(loops)
    if op.kind in ("matmul", "batch_matmul") and len(loops) == 3 + (op.kind == "batch_matmul"):
        b, (m, n, k) = (loops[0] if op.kind == "batch_matmul" else 1), loops[-3:]
        a_s, b_s, c_s = (sizes * 3)[:3] if len(sizes) == 1 else (sizes + [None] * 3)[:3]
        moved = None if None in (a_s, b_s, c_s) else b * (m * k * a_s + k * n * b_s + m * n * c_s)
        return Work(2.0 * points, moved, moved is not None and op.consumer is None)
    flops = 2.0 * points if op.kind in CONTRACTIONS or op.kind.startswith("conv") else None
    if not sizes:
        return Work(flops, None)
    if op.shaped:  # its largest tensor read once, and written once unless a consumer is fused
        return Work(flops, float(points * sizes[0] * (1 if op.consumer else 2)))
    if op.kind in ("elementwise", "elementwise_transpose", "transpose"):
        # The output and at least the smallest input over the whole loop space (the others may
        # be broadcast); a collapsed type: one in, one out.
        return Work(flops, float(points * (min(sizes[:-1] or sizes) + sizes[-1])))
    if op.kind in ("elementwise_broadcast", "broadcast"):
        return Work(flops, float(points * sizes[-1]))  # the output alone: the inputs are broadcast
    return Work(flops, float(points * sizes[0]))  # a reduction and the rest: the first operand read once


def tensor_bytes(t: ModelTensor) -> float | None:
    size = element_bytes(t.dtype)
    if size is None or any(d is None for d in t.shape):
        return None
    return float(math.prod(int(d) for d in t.shape) * size)


def _numel(t: ModelTensor) -> int:
    return math.prod(int(d or 0) for d in t.shape)


# --------------------------------------------------------------------------- report ops


@dataclass(frozen=True)
class ReportOp:
    """An op of the replace report (replaced or kept), as the advisor reads it."""

    kind: str  # the report's "op": linalg.matmul, layer_norm, iree_linalg_ext.attention, ...
    location: str
    inputs: tuple[ModelTensor, ...]
    result: ModelTensor
    kernel_entry: str | None  # None: kept
    reasons: tuple[str, ...] = ()
    arithmetic: str | None = None
    decomposed: bool = False

    @property
    def text(self) -> str:
        return f"{self.kind} ({', '.join(t.text for t in self.inputs)}) -> {self.result.text}"

    def work(self) -> Work:
        """FLOPs and bytes of the op: matmul 2*M*N*K (batch too), attention 4*b*h*sq*sk*d,
        others none; bytes the sum of its operands and result."""
        moved = [tensor_bytes(t) for t in (*self.inputs, self.result)]
        total = None if None in moved else float(sum(moved))  # type: ignore[arg-type]
        return Work(self.flops(), total, total is not None)

    def _readable(self) -> bool:
        """Static shapes, and no scalar where a dim is read (a record's entry is not trusted)."""
        tensors = (*self.inputs, self.result)
        return bool(self.inputs) and all(t.shape and None not in t.shape for t in tensors)

    def flops(self) -> float | None:
        if not self._readable():
            return None
        a = self.inputs[0]
        if self.kind in ("linalg.matmul", "linalg.batch_matmul") and len(self.inputs) >= 2:
            k = int(a.shape[-1] or 0)
            return 2.0 * (_numel(a) // max(k, 1)) * k * int(self.result.shape[-1] or 0)
        if self.kind == "iree_linalg_ext.attention" and len(self.inputs) >= 3:
            q, key = a, self.inputs[1]
            sk, d = int(key.shape[-2] or 0), int(q.shape[-1] or 0)
            return 4.0 * (_numel(q) // max(d, 1)) * sk * d
        return None

    def matches(self, op: DispatchOp) -> bool:
        """Whether IREE's dispatch `op` computes this op (or, for a norm or decomposed attention,
        part of it), by kind and shape: how a profile pairs IREE's dispatch with the kit kernel
        that replaces the same op."""
        if any(d is None for d in op.loops) or not self._readable():
            return False
        loops = tuple(int(d) for d in op.loops)  # type: ignore[arg-type]
        a = self.inputs[0]
        if self.kind in ("linalg.matmul", "linalg.batch_matmul"):
            return _contraction(op, loops) == self._contraction_shape() and (not op.dtypes or op.dtypes[0] == a.dtype)
        if self.kind in ("layer_norm", "rms_norm"):  # its reductions, and a per-row step (1 / sqrt)
            cols = int(a.shape[-1] or 0)
            rows = _numel(a) // max(cols, 1)
            return (op.kind == "reduction" and loops == (rows, cols)) or (op.kind == "elementwise" and loops == (rows,) and op.dtypes == ("f32",))
        if self.kind == "linalg.softmax":
            return op.kind == "softmax" and _rows(loops) == _rows(tuple(int(d or 0) for d in a.shape))
        if self.kind == "iree_linalg_ext.attention" and len(self.inputs) >= 3:
            if op.kind == "attention":
                return sorted(loops) == sorted(self._attention_loops())
            return self.decomposed and self._decomposed_matches(op, loops)
        if self.kind == "linalg.generic":
            return op.kind == "elementwise" and math.prod(loops) == _numel(self.result)
        return False

    def _contraction_shape(self) -> tuple[int, int, int, int]:
        """(batch, M, N, K); batch 1 where the op has none (IREE names batch 1 as it is)."""
        a = [int(d or 0) for d in self.inputs[0].shape]
        n = int(self.result.shape[-1] or 0)
        if self.kind == "linalg.batch_matmul" and len(a) == 3:
            return a[0], a[1], n, a[2]
        return 1, math.prod(a[:-1]), n, a[-1]

    def _attention_loops(self) -> list[int]:
        """Its loop ranges: Q's batch dims, sq and d, then sk (from K) and dv (from the result)."""
        q, key = (tuple(int(d or 0) for d in t.shape) for t in self.inputs[:2])
        return [*q, key[-2], int(self.result.shape[-1] or 0)]

    def _decomposed_matches(self, op: DispatchOp, loops: tuple[int, ...]) -> bool:
        """Q K^T (b*h, sq, sk, d), its softmax (b*h*sq rows of sk) and P V (b*h, sq, d, sk)."""
        if len(self.inputs) < 3:
            return False
        q, key = (tuple(int(d or 0) for d in t.shape) for t in self.inputs[:2])
        heads, sq, d, sk = math.prod(q[:-2]), q[-2], q[-1], key[-2]
        if op.kind == "softmax":
            return _rows(loops) == (heads * sq, sk)
        return _contraction(op, loops) in ((heads, sq, sk, d), (heads, sq, d, sk))


def _contraction(op: DispatchOp, loops: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    if op.kind == "matmul" and len(loops) == 3:
        return (1, *loops)
    if op.kind == "batch_matmul" and len(loops) == 4:
        return loops  # type: ignore[return-value]
    return None


def _rows(shape: tuple[int, ...]) -> tuple[int, int]:
    return (math.prod(shape[:-1]), shape[-1]) if shape else (0, 0)


def report_ops(record: ModelRecord) -> tuple[ReportOp, ...]:
    """The replaced and kept ops of a model record, read defensively: an entry without types is
    skipped (the record's reader checked only the fields compare needs)."""
    out = []
    for entry, replaced in [*((r.entry, True) for r in record.replaced), *((e, False) for e in record.not_replaced)]:
        op = _report_op(entry, replaced)
        if op is not None:
            out.append(op)
    return tuple(out)


def _report_op(entry: Mapping, replaced: bool) -> ReportOp | None:
    def tensor(t: object) -> ModelTensor | None:
        ok = isinstance(t, Mapping) and isinstance(t.get("dtype"), str) and isinstance(t.get("shape"), list)
        ok = ok and all(d is None or (isinstance(d, int) and not isinstance(d, bool)) for d in t["shape"])
        return ModelTensor(t["dtype"], tuple(t["shape"])) if ok else None

    inputs = [tensor(t) for t in entry.get("inputs", [])] if isinstance(entry.get("inputs"), list) else [None]
    result = tensor(entry.get("result"))
    if result is None or None in inputs or not isinstance(entry.get("op"), str):
        return None
    reasons = entry.get("reasons", [])
    attention = entry.get("attention")
    return ReportOp(
        kind=entry["op"],
        location=str(entry.get("location", "")),
        inputs=tuple(inputs),  # type: ignore[arg-type]
        result=result,
        kernel_entry=str(entry["kernel_entry"]) if replaced else None,
        reasons=tuple(str(r) for r in reasons) if isinstance(reasons, list) else (),
        arithmetic=entry.get("arithmetic") if isinstance(entry.get("arithmetic"), str) else None,
        decomposed=isinstance(attention, Mapping) and "decomposed" in attention,
    )


# --------------------------------------------------------------------------- peaks


@dataclass(frozen=True)
class Peaks:
    """A GPU's datasheet peaks: dense (no sparsity) tensor-core TFLOP/s for f16/bf16 inputs
    with f32 accumulation and for TF32, f32 TFLOP/s on the CUDA cores, HBM/DRAM GB/s."""

    gpu: str
    f16_tflops: float
    tf32_tflops: float
    f32_tflops: float
    memory_gbps: float
    source: str

    def flops_peak(self, dtype: str, arithmetic: str | None = None) -> tuple[float, str] | None:
        """(TFLOP/s, what it is) for a contraction of `dtype` inputs, run in `arithmetic` (a
        kit kernel's tf32 / 3xtf32: three TF32 products for each f32 one)."""
        if dtype in ("f16", "bf16"):
            return self.f16_tflops, f"{dtype} tensor peak"
        if dtype == "f32" and arithmetic == "tf32":
            return self.tf32_tflops, "TF32 tensor peak"
        if dtype == "f32" and arithmetic == "3xtf32":
            return self.tf32_tflops / 3, "TF32 tensor peak / 3 (3xTF32)"
        if dtype == "f32":
            return self.f32_tflops, "f32 peak (CUDA cores)"
        return None


# NVIDIA's datasheets (boost clocks; sparsity figures halved to dense). Matched by the device
# name CUDA reports (cuDeviceGetName), most specific first; the compute capability guards a match.
PEAKS: tuple[tuple[str, int, Peaks], ...] = (
    ("H100 NVL", 90, Peaks("H100 NVL", 835.0, 417.5, 60.0, 3900.0, "NVIDIA H100 NVL datasheet")),
    ("H100 PCIe", 90, Peaks("H100 PCIe", 756.0, 378.0, 51.0, 2000.0, "NVIDIA H100 datasheet (PCIe)")),
    ("H100", 90, Peaks("H100 SXM", 989.4, 494.7, 66.9, 3350.0, "NVIDIA H100 datasheet (SXM5)")),
    ("H200 NVL", 90, Peaks("H200 NVL", 835.0, 417.5, 60.0, 4800.0, "NVIDIA H200 datasheet (NVL)")),
    ("H200", 90, Peaks("H200 SXM", 989.4, 494.7, 66.9, 4800.0, "NVIDIA H200 datasheet (SXM)")),
    ("A100-SXM4-80GB", 80, Peaks("A100 SXM4 80GB", 312.0, 156.0, 19.5, 2039.0, "NVIDIA A100 datasheet")),
    ("A100-SXM4-40GB", 80, Peaks("A100 SXM4 40GB", 312.0, 156.0, 19.5, 1555.0, "NVIDIA A100 datasheet")),
    ("A100 80GB PCIe", 80, Peaks("A100 PCIe 80GB", 312.0, 156.0, 19.5, 1935.0, "NVIDIA A100 datasheet")),
    ("A100-PCIE-40GB", 80, Peaks("A100 PCIe 40GB", 312.0, 156.0, 19.5, 1555.0, "NVIDIA A100 datasheet")),
    ("L40S", 89, Peaks("L40S", 362.05, 183.0, 91.6, 864.0, "NVIDIA L40S datasheet")),
    ("L4", 89, Peaks("L4", 121.0, 60.0, 30.3, 300.0, "NVIDIA L4 datasheet")),
    ("A10", 86, Peaks("A10", 125.0, 62.5, 31.2, 600.0, "NVIDIA A10 datasheet")),
)


def peaks_for(device_name: str | None, capability: int | None = None) -> Peaks | None:
    """The peaks of the GPU CUDA names `device_name` (e.g. "NVIDIA H100 80GB HBM3"); None for a
    GPU not in PEAKS (the fractions are then left out) or a name whose compute capability
    contradicts the table's."""
    if not device_name:
        return None
    for key, cc, peaks in PEAKS:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", device_name) and capability in (None, cc):
            return peaks
    return None


# --------------------------------------------------------------------------- advice


@dataclass(frozen=True)
class Timed:
    """A profiled dispatch as the advisor needs it (compare.py's DispatchTime has more)."""

    name: str
    per_call_us: float
    launches_per_call: float


@dataclass(frozen=True)
class StandIn:
    """The kit kernel for a dispatch and the saving a call: `how` is "measured" (tune) or
    "estimated" (both builds profiled); None where neither is known."""

    kernel: str
    ops: int  # the replaced ops it stands for in this dispatch
    saving_us: float | None
    how: str | None
    detail: str = ""

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "ops": self.ops, "saving_us": self.saving_us, "how": self.how, "detail": self.detail}


@dataclass(frozen=True)
class Achieved:
    tflops: float | None
    gbps: float | None
    fraction: float | None  # of `of`
    of: str | None
    bytes_exact: bool = True

    def to_json(self) -> dict:
        return {"tflops": self.tflops, "gbps": self.gbps, "fraction": self.fraction, "of": self.of, "bytes_exact": self.bytes_exact}


@dataclass(frozen=True)
class Advice:
    """One row of the advisor's table."""

    name: str
    per_call_us: float
    share: float
    op: DispatchOp
    what: str  # the op in words (a kit kernel: the ops it replaced)
    work: Work
    achieved: Achieved
    stand_in: StandIn | None
    note: str = ""

    def to_json(self) -> dict:
        return {
            "name": self.name, "per_call_us": self.per_call_us, "share": self.share, "op": self.op.to_json(), "what": self.what,
            "flops": self.work.flops, "bytes": self.work.bytes, "achieved": self.achieved.to_json(),
            "stand_in": None if self.stand_in is None else self.stand_in.to_json(), "note": self.note,
        }


@dataclass(frozen=True)
class _Instance:
    """An op a kit kernel stands in for (replaced, or kept by `tune`), with IREE's time and the
    kernel's time for it, a call, where known."""

    op: ReportOp
    kernel: str
    iree_us: float | None
    kit_us: float | None
    how: str | None  # "measured", "estimated", None: no time to compare
    decision: str = ""  # the tune record's, where it has one


# A dispatch below this share of the device time gets no note on why no kernel stands in.
NOTE_SHARE = 0.01


def advise(
    rows: Sequence[Timed], ops: Sequence[ReportOp], *, kit_build: bool, other: Sequence[Timed] = (),
    tune: Sequence[TuneEntry] | None = None, peaks: Peaks | None = None,
) -> tuple[Advice, ...]:
    """The advisor's rows for the dispatches of one build (`rows`; `kit_build`: the kit's build,
    else IREE's own), sorted by device time. `other`: the other build's dispatches, where it was
    profiled too (estimated savings; new dispatches of the kit's build); `tune`: measured ones."""
    kernels = {o.kernel_entry for o in ops if o.kernel_entry}
    baseline_rows, kit_rows = (other, rows) if kit_build else (rows, other)
    instances = _instances(ops, baseline_rows, kit_rows, kernels, tune)
    total = sum(r.per_call_us for r in rows) or 1.0
    other_names = {unnumbered(t.name) for t in other}
    out = []
    for r in sorted(rows, key=lambda t: t.per_call_us, reverse=True):
        op = parse_dispatch(r.name, kernels)
        if op.kind == "kit kernel":
            out.append(_kit_row(r, op, instances, total, peaks))
        else:
            new = kit_build and bool(other) and unnumbered(r.name) not in other_names
            out.append(_iree_row(r, op, ops, instances, rows, kernels, total, peaks, kit_build=kit_build, new=new))
    return tuple(out)


def _kit_row(r: Timed, op: DispatchOp, instances: Sequence[_Instance], total: float, peaks: Peaks | None) -> Advice:
    """A kit kernel's row: the ops it replaced, their work (each run once a call), the saving."""
    mine = [i for i in instances if i.kernel == r.name and i.op.kernel_entry]
    work = sum((i.op.work() for i in mine), NO_WORK)
    dtype, arithmetic = (mine[0].op.inputs[0].dtype, mine[0].op.arithmetic) if mine else (None, None)
    return Advice(r.name, r.per_call_us, r.per_call_us / total, op, _replaced_text([i.op for i in mine]), work,
                  achieved(work, r.per_call_us, peaks, dtype, arithmetic), _kit_stand_in(r.name, mine))


def _iree_row(
    r: Timed, op: DispatchOp, ops: Sequence[ReportOp], instances: Sequence[_Instance], rows: Sequence[Timed], kernels: set[str],
    total: float, peaks: Peaks | None, *, kit_build: bool, new: bool,
) -> Advice:
    """IREE's dispatch's row: the work its name says (one launch's), the kernel that stands in
    for ops of its kind and shape, or why none does."""
    # In the kit's build IREE's dispatches compute only what was kept.
    served = [o for o in ops if o.matches(op) and not (kit_build and o.kernel_entry)]
    work = dispatch_work(op)
    if work.flops is None and op.kind == "attention" and served:  # its name has no roles: the op's
        work = Work(served[0].flops(), work.bytes, work.bytes_exact)
    stand_in = _iree_stand_in(r, served, instances, rows, kernels)
    note = _note(op, served, new, stand_in) if r.per_call_us / total >= NOTE_SHARE or new else ""
    launch_us = r.per_call_us / r.launches_per_call if r.launches_per_call > 0 else r.per_call_us
    return Advice(r.name, r.per_call_us, r.per_call_us / total, op, op.text, work,
                  achieved(work, launch_us, peaks, op.dtypes[0] if op.dtypes else None), stand_in, note)


def _instances(
    ops: Sequence[ReportOp], baseline_rows: Sequence[Timed], kit_rows: Sequence[Timed], kernels: set[str],
    tune: Sequence[TuneEntry] | None,
) -> list[_Instance]:
    """Every op a kit kernel stands in for, with IREE's time and the kit's time for it a call:
    measured by its tune probe where there is one (a kept op too: tune kept it), else, for a
    replaced op, estimated: IREE's time a launch of the dispatches that compute ops of its kind
    and shape; the kit kernel's time a call shared among the ops it replaces by their FLOPs
    (bytes where they have none)."""
    # A probe tune could not time (it failed, or its outputs differ) gives no saving.
    by_location = {loc: p for p in tune or () if p.kit_us is not None and p.iree_us is not None for loc in p.locations}
    # A saving measured in the model is that of every op its held-out build left to IREE.
    held_out_ops: dict[object, int] = {}
    for p in tune or ():
        if p.timed_in_model:
            held_out_ops[_held_out_key(p)] = held_out_ops.get(_held_out_key(p), 0) + len(p.locations)
    replaced = [o for o in ops if o.kernel_entry]
    kit_time = {t.name: t.per_call_us for t in kit_rows if t.name in kernels}
    parsed = [(t, parse_dispatch(t.name, kernels)) for t in baseline_rows]
    out = []
    for o in ops:
        probe = by_location.get(o.location)
        if probe is not None:
            iree_us = probe.iree_us
            if probe.timed_in_model:  # IREE's time for it in the model: the kernel's plus the saving the model showed, per op
                iree_us = probe.kit_us + (probe.heldout_us - probe.model_us) / held_out_ops[_held_out_key(probe)]
            out.append(_Instance(o, o.kernel_entry or probe.kernel, iree_us, probe.kit_us, "measured", probe.decision))
            continue
        if not o.kernel_entry:
            continue
        weights = sum(_weight(o2) for o2 in replaced if o2.kernel_entry == o.kernel_entry)
        kit = kit_time.get(o.kernel_entry)
        kit_us = kit * _weight(o) / weights if kit is not None and weights else None
        iree = [t for t, d in parsed if o.matches(d)]
        launches = sum(t.launches_per_call for t in iree)
        iree_us = sum(t.per_call_us for t in iree) / launches if iree and launches else None
        # Norms and decomposed attention span several IREE dispatches: one launch of each.
        if iree_us is not None and (o.kind in ("layer_norm", "rms_norm") or o.decomposed):
            iree_us = sum(t.per_call_us / max(t.launches_per_call, 1.0) for t in iree)
        known = kit_us is not None and iree_us is not None
        out.append(_Instance(o, o.kernel_entry, iree_us, kit_us, "estimated" if known else None))
    return out


def _held_out_key(entry: TuneEntry) -> object:
    """The held-out build a tune entry's model times come from (its times, in records that do not name it)."""
    return entry.heldout or (entry.model_us, entry.heldout_us)


def _weight(o: ReportOp) -> float:
    w = o.work()
    return w.flops or w.bytes or 1.0


def _how(known: Sequence[_Instance]) -> str | None:
    hows = {i.how for i in known}
    return None if not hows else hows.pop() if len(hows) == 1 else "measured and estimated"


def _kit_stand_in(kernel: str, mine: Sequence[_Instance]) -> StandIn:
    known = [i for i in mine if i.how]
    saving = sum(i.iree_us - i.kit_us for i in known) if known else None  # type: ignore[operator]
    missing = len(mine) - len(known)
    detail = f"the kit kernel itself, for {len(mine)} op(s)" + (f", {missing} without an IREE time to compare" if missing else "")
    return StandIn(kernel, len(mine), saving, _how(known), detail)


def _iree_stand_in(row: Timed, served: Sequence[ReportOp], instances: Sequence[_Instance], rows: Sequence[Timed], kernels: set[str]) -> StandIn | None:
    """For IREE's dispatch: the kit kernel that stands in for ops it computes, with the saving
    of this dispatch's share (its time among this build's dispatches that compute those ops)."""
    mine = [i for i in instances if i.op in served]
    if not mine:
        return None
    names = ", ".join(sorted({i.kernel for i in mine}))
    known = [i for i in mine if i.how]
    if not known:
        return StandIn(names, len(mine), None, None, "profile a folder built with --with-baseline, or run `kitdispatch tune`")
    ops = [i.op for i in mine]
    share_rows = [t for t in rows if any(o.matches(parse_dispatch(t.name, kernels)) for o in ops)] or [row]
    share = row.per_call_us / (sum(t.per_call_us for t in share_rows) or row.per_call_us)
    saving = share * sum(i.iree_us - i.kit_us for i in known)  # type: ignore[operator]
    kept = [i for i in known if i.decision and i.decision != "replace"]
    detail = f"{share:.0%} of the IREE dispatches its {len(mine)} op(s) ran in" + (f"; tune kept {len(kept)}" if kept else "")
    return StandIn(names, len(mine), saving, _how(known), detail)


def _note(op: DispatchOp, served: Sequence[ReportOp], new: bool, stand_in: StandIn | None) -> str:
    """Why no kernel stands in for an IREE dispatch: new since the replacement, the report's
    reason for the ops of its kind and shape it kept, or the op kind no kernel takes."""
    if new:
        return "not in IREE's own build: likely what IREE had fused into a replaced op's dispatch, now run alone"
    if stand_in is not None:
        return ""
    # A kept generic's reasons say how it differs from each pattern kernel: not why no kernel fits.
    kept = [o for o in served if o.kernel_entry is None and o.reasons and o.kind != "linalg.generic"]
    if kept:
        return f"no kernel stands in: kept: {short_reason(kept[0].reasons[0])}"
    if op.kind == "slow_memcpy":
        return "no kernel stands in: a plain copy IREE made between dispatches (a layout it could not fuse)"
    after = f" read by a {op.consumer} (fused)" if op.consumer else ""
    return f"no kernel stands in: no library kernel takes {op.text}{after}" if op.kind != "unknown" else "no kernel stands in"


def short_reason(reason: str) -> str:
    """A report reason with its list of kernels cut to the first ("k1, k2, ...: why")."""
    head, sep, why = reason.partition(": ")
    names = head.split(", ")
    if not sep or len(names) < 3 or not all(re.fullmatch(r"\w+", n) for n in names):
        return reason
    return f"{names[0]} and {len(names) - 1} other kernels: {why}"


def _replaced_text(ops: Sequence[ReportOp]) -> str:
    if not ops:
        return "kit kernel"
    kinds: dict[str, int] = {}
    for o in ops:
        kinds[o.text] = kinds.get(o.text, 0) + 1
    return "; ".join(f"{n}x {t}" if n > 1 else t for t, n in kinds.items())


# Clocks are left alone while profiling: a GPU may boost a little past its datasheet's clock.
CLOCK_MARGIN = 1.05


def achieved(work: Work, per_call_us: float, peaks: Peaks | None, dtype: str | None, arithmetic: str | None = None) -> Achieved:
    """The rate a dispatch reached: TFLOP/s against the tensor (or f32) peak of its input type
    where it computes FLOPs, else GB/s against memory bandwidth; fraction None without peaks."""
    if per_call_us <= 0:
        return Achieved(None, None, None, None)
    seconds = per_call_us * 1e-6
    tflops = work.flops / seconds / 1e12 if work.flops else None
    gbps = work.bytes / seconds / 1e9 if work.bytes else None
    if tflops is not None:
        peak = peaks.flops_peak(dtype or "", arithmetic) if peaks else None
        if peaks and peak and dtype == "f32" and arithmetic is None and tflops > peak[0] * CLOCK_MARGIN:
            # Faster than the CUDA cores can go: the codegen ran it on TF32 tensor cores.
            peak = peaks.tf32_tflops, "TF32 tensor peak (beyond the f32 one: run in TF32)"
        return Achieved(tflops, gbps, tflops / peak[0] if peak else None, peak[1] if peak else None, work.bytes_exact)
    if gbps is not None and peaks is not None:
        return Achieved(None, gbps, gbps / peaks.memory_gbps, "memory bandwidth", work.bytes_exact)
    return Achieved(None, gbps, None, None, work.bytes_exact)


# --------------------------------------------------------------------------- printing


def format_advice(rows: Sequence[Advice], *, peaks: Peaks | None) -> list[str]:
    """The table: a row per dispatch, heaviest first, with what stands in for it, then the total."""
    total = sum(r.per_call_us for r in rows)
    lines = [f"{'us/call':>9} {'share':>6}  {'achieved':<28} dispatch: what it computes; stand-in"]
    for r in rows:
        lines.append(f"{r.per_call_us:9.1f} {r.share:6.1%}  {_achieved_text(r.achieved):<28} {r.name}: {r.what}")
        if r.stand_in is not None:
            lines.append(f"{'':18}-> {_stand_in_text(r.stand_in)}")
        if r.note:
            lines.append(f"{'':18}-> {r.note}")
    lines.append(f"{total:9.1f} {1.0 if rows else 0.0:6.1%}  total device time a call")
    if peaks is None:
        lines.append("fractions of peak left out: the GPU is not in the advisor's table of peaks (models/advisor.py PEAKS)")
    return lines


def _achieved_text(a: Achieved) -> str:
    bound = "" if a.bytes_exact or a.tflops is not None else ">="  # FLOPs are exact; bytes from a name a lower bound
    if a.tflops is not None:
        text = f"{a.tflops:.1f} TFLOP/s"
    elif a.gbps is not None:
        text = f"{bound}{a.gbps:.0f} GB/s"
    else:
        return "-"
    return text + (f" {bound}{a.fraction:.0%} of peak" if a.fraction is not None else "")


def _stand_in_text(s: StandIn) -> str:
    if s.saving_us is None:
        return f"kit kernel {s.kernel}: saving unknown ({s.detail})"
    verb = "saves" if s.saving_us >= 0 else "costs"
    return f"kit kernel {s.kernel}: {verb} {abs(s.saving_us):.1f} us a call ({s.how}; {s.detail})"


__all__ = [
    "PEAKS", "Achieved", "Advice", "DispatchOp", "Peaks", "ReportOp", "StandIn", "Timed", "Work", "achieved",
    "advise", "dispatch_work", "format_advice", "parse_dispatch", "parse_summary", "peaks_for",
    "report_ops", "short_reason", "unnumbered",
]
