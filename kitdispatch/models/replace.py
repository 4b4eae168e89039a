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
from kitdispatch.models.ops.base import CAPTURED, Call, Layout, OpFacts, TensorFacts

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
        return self.function + "".join("_via" + "_".join("c" if i == CAPTURED else str(i) for i in o.path)
                                       for o in self.call.operands if len(o.path) > 1)

    def to_json(self) -> dict:
        data = self.op.to_json()
        if self.kernel is not None:
            data["kernel"] = self.kernel.name
            data["kernel_entry"] = self.kernel.entry  # its export: the dispatch's name in profiles
            data["function_called"] = self.function
            if self.kernel.replaces.arithmetic is not None:  # ARITHMETICS says what each means
                data["arithmetic"] = self.kernel.replaces.arithmetic
            if self.kernel.replaces.epilogue != "none" or self.call.marked:  # the ops after it, replaced with it
                data["epilogue_replaced"] = {"epilogue": self.kernel.replaces.epilogue, "ops_after": self.call.marked}
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
    """Every op of `kinds` in the model (an `iree.compiler.ir.Module`), with its facts. An op
    that several kinds read as their own (a linalg.generic that ends a norm) goes to the first
    in the registry's order that takes it as a candidate; kinds that read it as the anchor of a
    longer form (decomposed attention's last matmul) read it too, and `settle` decides; an op a
    candidate covers (a norm's reductions) is no candidate of its own."""
    from iree.compiler import ir

    found: list[tuple[object, OpFacts]] = []
    owners: dict[str, list] = {}  # IREE op name -> the kinds that read it as their own, in registry order
    anchors: dict[str, list] = {}  # IREE op name -> kinds that also read it as the anchor of a longer form
    for name, kind in OP_KINDS.items():
        if name in kinds:
            owners.setdefault(kind.op, []).append(kind)
            for other in kind.reads:
                anchors.setdefault(other, []).append(kind)

    def visit(op: ir.Operation):
        own = next((k for k in owners.get(op.name, ()) if k.candidate(op)), None)
        for kind in ([own] if own is not None else []) + [k for k in anchors.get(op.name, ()) if k.candidate(op)]:
            found.append((op, kind.facts(op)))
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    covered = [c for op, facts in found for c in OP_KINDS[facts.kind].covers(op)]
    return [(op, facts) for op, facts in found if all(op != c for c in covered)]


def decide(ops: Sequence[OpFacts], kernels: Sequence[Kernel], *, tf32: bool = False) -> list[Decision]:
    """Per op, the kernel that computes exactly what it computes and replaces the most ops
    with it (a matmul with its epilogue before a bare matmul: its call's `marked`), the first
    in manifest order among those, calls that are a fallback (Call.fallback) after the rest.
    Kernels that compute in plain TF32 (replace_when.arithmetic) take part only with `tf32`."""
    decisions = []
    for op in ops:
        kind, reasons, fits = OP_KINDS[op.kind], [], []
        for kernel in kernels:
            if op.kind not in kernel.replaces.ops or (kernel.replaces.arithmetic == "tf32" and not tf32):
                continue
            layout = check_kernel(kernel, op.kind)
            why = kind.mismatch(op, kernel, layout)
            if why is None:
                fits.append(Decision(kind.replaced(op, layout), kernel, kind.call(op, layout)))
            else:
                reasons.append((kernel.name, why))
        if fits:
            decisions.append(max(fits, key=lambda d: (d.call.marked, not d.call.fallback)))  # the first of the longest
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


def after(op: ir.Operation, steps: int) -> list:
    """The ops `steps` down the chain of single users of `op`'s result 0 (those a call with
    `marked = steps` replaces with it; the kind checked that each has one user)."""
    chain = []
    for _ in range(steps):
        op = next(iter(op.results[0].uses)).owner.operation
        chain.append(op)
    return chain


def settle(found: Sequence[tuple[object, OpFacts]], decisions: Sequence[Decision]) -> list[Decision]:
    """Decisions in the order of `found`, where a replacement that removes other ops wins over
    those ops' own decisions (they are kept, saying which kernel computes them): the ops its
    kind `claims` (decomposed attention's chain up from its last matmul, a mask made for the
    op alone) and those down to the op its call marks (a matmul's epilogue generics). Only a
    replacement that stands claims: one whose own op another's claims (the Q K^T matmul of an
    attention chain) takes nothing with it, so the ops it would have claimed (that matmul's
    truncation) are said to be the standing one's, or keep their own decisions."""
    ops = [op for op, _ in found]
    claims = {i: (*OP_KINDS[d.op.kind].claims(ops[i]), *after(ops[i], d.call.marked))
              for i, d in enumerate(decisions) if d.kernel is not None}
    standing, cycles = _standing(ops, claims)
    claimed: dict = {}
    for i in (*sorted(standing), *sorted(cycles)):  # in a cycle the first to claim an op takes it, as before
        for other in claims[i]:
            claimed.setdefault(other, i)
    settled = []
    for i, ((op, facts), decision) in enumerate(zip(found, decisions)):
        owner = claimed.get(op)
        if owner is not None and owner != i:
            d = decisions[owner]
            why = f"part of the {d.op.kind} at {d.op.location}, which {d.kernel.name} replaces whole"
            decision = Decision(facts, None, reasons=(why,))
        settled.append(decision)
    return settled


def _standing(ops: list, claims: dict[int, tuple]) -> tuple[set[int], set[int]]:
    """The replacements that stand (no standing replacement claims their op, found from the
    ones nothing claims down), and those left that claim each other's ops in a cycle."""
    by_op: dict = {}
    for j, taken in claims.items():
        for other in taken:
            by_op.setdefault(other, []).append(j)
    claimers = {i: [j for j in by_op.get(ops[i], ()) if j != i] for i in claims}
    standing: set[int] = set()
    fallen: set[int] = set()
    undecided = set(claims)
    while undecided:
        settled_now = set()
        for i in undecided:
            if any(j in standing for j in claimers[i]):
                fallen.add(i)
                settled_now.add(i)
            elif all(j in fallen for j in claimers[i]):
                standing.add(i)
                settled_now.add(i)
        if not settled_now:
            break  # a cycle: the rest give way
        undecided -= settled_now
    return standing, undecided


__all__ = [
    "COVERED_ATTRIBUTE", "MARK_ATTRIBUTE", "Decision", "OpFacts", "TensorFacts", "check_kernel", "decide", "read_ops", "replacing_kernels",
    "settle", "wrapper_name",
]
