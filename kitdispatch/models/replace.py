"""Which ops of an imported model a kit kernel may stand in for.

The model is read with IREE's own MLIR bindings (`iree.compiler.ir`) at the stage where the
transform spec runs (after global optimization, see pipeline.py). Each op of a kind that some
kernel `replaces` is checked against that kernel: element types, ranks, static sizes, the
limits of `replace_when`, and what the op computes beyond its types, as its kind (models/ops,
one module a kind) reads it. An op is replaced only where the kernel computes exactly what it
computes; every other op of those kinds gets the reason. Nothing here names a kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collections.abc import Sequence
import hashlib
from dataclasses import dataclass

from kitdispatch.describe.kernel import Kernel
from kitdispatch.describe.module import ModuleSpec
from kitdispatch.errors import ManifestError
from kitdispatch.models.ops import OP_KINDS
from kitdispatch.models.ops.base import Call, Layout, OpFacts, TensorFacts

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

# What the kit's symbols in a model (kernel executables, wrappers) start with: model symbols stay free.
KIT_PREFIX = "kitdispatch_"
# The discardable attribute that marks an op for the spec: its value is the wrapper to call.
MARK_ATTRIBUTE = "kitdispatch.replace"
# Marks the ops a replacement takes in beyond the marked one (a matmul before its epilogue).
COVERED_ATTRIBUTE = "kitdispatch.covered"


@dataclass(frozen=True)
class Decision:
    """What happens to one op: the kernel that replaces it (None: kept) and how the spec calls
    it (`call`), and for every declared kernel that does not fit, why."""

    op: OpFacts
    kernel: Kernel | None
    call: Call = Call(())
    reasons: tuple[str, ...] = ()

    @property
    def paths(self) -> tuple[tuple[int, ...], ...]:
        """Where the tensors the kernel reads come from (Operand.path), in argument order."""
        return tuple(o.path for o in self.call.operands)

    @property
    def function(self) -> str:
        """The `util.func` the spec calls in place of the op: the kernel's wrapper, or an
        adapter of this op's types (reshapes, constants) named by what it adds."""
        name = wrapper_name(self.kernel) + self.call.variant
        return f"{name}_{_digest(self.op.inputs, self.op.result, self.call)}" if self.call.needs_adapter else name

    @property
    def mark(self) -> str:
        """MARK_ATTRIBUTE's value: one per way of calling (function, operand paths)."""
        return self.function + "".join("_via" + "_".join(map(str, o.path)) for o in self.call.operands if len(o.path) > 1)

    def to_json(self) -> dict:
        data = self.op.to_json()
        if self.kernel is not None:
            data["kernel"] = self.kernel.name
            data["kernel_entry"] = self.kernel.entry  # its export: the dispatch's name in profiles
            data["function_called"] = self.function
            if self.kernel.replaces.arithmetic is not None:  # ARITHMETICS says what each means
                data["arithmetic"] = self.kernel.replaces.arithmetic
        else:
            data["reasons"] = list(self.reasons)
        return data


def _digest(*parts: object) -> str:
    """A short name part that tells adapters of different types, reshapes or constants apart."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:8]


def wrapper_name(kernel: Kernel) -> str:
    """The `util.func` the spec imports into the model (prefixed: model symbols stay free)."""
    return f"{KIT_PREFIX}{kernel.function}"


def replacing_kernels(spec: ModuleSpec) -> tuple[Kernel, ...]:
    kernels = tuple(k for k in spec.kernels if k.replaces is not None)
    if not kernels:
        raise ManifestError(
            f"no kernel of {spec.name} declares `replaces`",
            where=str(spec.root),
            fix=f'add replaces = ["{next(iter(OP_KINDS))}"] (or the op it stands in for) to the kernel in kitdispatch.toml',
        )
    for kernel in kernels:
        for kind in kernel.replaces.ops:
            check_kernel(kernel, kind)
    return kernels


def check_kernel(kernel: Kernel, kind: str) -> Layout:
    """The kernel's params must be able to compute `kind` at all; else a ManifestError
    (what is missing is a description problem, not a property of one op)."""
    return OP_KINDS[kind].contract(kernel, f"kernel {kernel.name}: replaces {kind}")


def read_ops(module: ir.Module, kinds: Sequence[str]) -> list[tuple[object, OpFacts]]:
    """Every op of `kinds` in the model (an `iree.compiler.ir.Module`), with its facts."""
    from iree.compiler import ir

    found: list[tuple[object, OpFacts]] = []

    def visit(op: ir.Operation):
        kind = OP_KINDS.get(op.name) if op.name in kinds else None
        if kind is not None and kind.candidate(op):
            found.append((op, kind.facts(op)))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def decide(ops: Sequence[OpFacts], kernels: Sequence[Kernel], *, tf32: bool = False) -> list[Decision]:
    """Per op, the first kernel (in manifest order) that computes exactly what it computes.
    Kernels that compute in plain TF32 (replace_when.arithmetic) take part only with `tf32`."""
    decisions = []
    for op in ops:
        kind, reasons = OP_KINDS[op.kind], []
        for kernel in kernels:
            if op.kind not in kernel.replaces.ops or (kernel.replaces.arithmetic == "tf32" and not tf32):
                continue
            layout = check_kernel(kernel, op.kind)
            why = kind.mismatch(op, kernel, layout)
            if why is None:
                decisions.append(Decision(op, kernel, kind.call(op, layout)))
                break
            reasons.append((kernel.name, why))
        else:
            decisions.append(Decision(op, None, reasons=_grouped(reasons)))
    return decisions


def _grouped(reasons: list[tuple[str, str]]) -> tuple[str, ...]:
    """'kernel: why' per distinct reason, the kernels that give the same one named together (a
    family's tile configs fail alike), in the order first given."""
    by_why: dict[str, list[str]] = {}
    for name, why in reasons:
        by_why.setdefault(why, []).append(name)
    return tuple(f"{', '.join(names)}: {why}" for why, names in by_why.items())


__all__ = ["COVERED_ATTRIBUTE", "MARK_ATTRIBUTE", "Decision", "OpFacts", "TensorFacts", "check_kernel", "decide", "read_ops", "replacing_kernels", "wrapper_name"]
