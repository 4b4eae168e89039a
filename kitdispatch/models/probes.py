"""Probes for `tune`: every distinct replaced chain of ops of a model as a module of its own,
and a capture module that hands tune the chains' real inputs.

A chain is what one replacement removes: the op its kind read (the anchor), the ops its kind
covers (a norm's reductions) and claims (decomposed attention's chain), the ops down to the one
its call marks (a matmul's epilogue), and the producers its operand paths pass. Its probe is a
`func.func @probe` whose arguments are the chain's inputs from outside it (values of ops not in
it; constants and what is made of constants alone, such as a zero-filled `outs`, are cloned in)
and whose result is the chain's. Chains that print the same (names and locations aside) share
one probe, which lists every location it stands for.

Each probe is built twice by the caller's `build_model` (the same projects and library, so its
route is the model's): with the kit's kernel and by IREE alone. Where its own build does not
replace it with the model's kernel, the probe says so and tune leaves its ops to the rule.

The capture module is the model at the matching stage with `flow.tensor.trace "probe_K/argJ"`
before the first use of each argument of the probe's first chain, compiled by IREE alone from
that stage: IREE's runtime hands each traced tensor to the HAL module's debug sink (models/tune.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kitdispatch.describe.probe_record import Probe, ProbeRecord, TuneRecord, probes_record_name, trace_key
from kitdispatch.describe.record import sha256
from kitdispatch.errors import UsageError
from kitdispatch.models.ops import OP_KINDS
from kitdispatch.models.ops.base import tensor_facts
from kitdispatch.models.replace import Decision, after

if TYPE_CHECKING:  # the MLIR bindings come with iree-base-compiler, loaded where a model is read
    from iree.compiler import ir  # annotations

# Ops whose results are never cloned into a probe, whatever their operands: they read state
# (a weight's global, an imported buffer), so their values are the probe's arguments.
_STATEFUL = ("util.", "hal.", "flow.", "stream.", "iree_tensor_ext.")


@dataclass(frozen=True)
class Chain:
    """The ops one replacement removes, as a probe."""

    decision: Decision
    ops: tuple  # ir.Operations, in block order
    arguments: tuple  # ir.Values from outside the chain, in order of first use
    text: str  # the probe module (no locations)
    why_not: str = ""  # why there is no probe for it (a dynamic tensor, ops in several blocks)

    @property
    def digest(self) -> str:
        return sha256(self.text.encode())


def chains(found: Sequence[tuple[object, object]], decisions: Sequence[Decision], context: ir.Context) -> list[Chain]:
    """A Chain per replaced op of `found` (read_ops' ops with their decisions)."""
    return [_chain(op, d, context) for (op, _), d in zip(found, decisions) if d.kernel is not None]


def _chain(anchor: ir.Operation, decision: Decision, context: ir.Context) -> Chain:
    anchor = anchor.operation
    kind = OP_KINDS[decision.op.kind]
    marked = ([anchor] + after(anchor, decision.call.marked))[-1]
    members = [anchor, *kind.covers(anchor), *kind.claims(anchor), *after(anchor, decision.call.marked)]
    for operand in decision.call.operands:  # the producers an operand path passes die with it
        op = marked
        for index in operand.path[:-1]:
            op = op.operands[index].owner.operation
            members.append(op)
    ops = _in_block_order(members)
    if ops is None:
        return Chain(decision, (), (), "", "its ops are not in one block")
    inside = set(ops)
    arguments, constants = _inputs(ops, inside)
    result = marked.results[0]
    typed = [*arguments, result]
    if not all(_static_tensor(v.type) for v in typed):
        return Chain(decision, tuple(ops), tuple(arguments), "", "an input or result of it is not a tensor of static sizes")
    return Chain(decision, tuple(ops), tuple(arguments), _probe_text(context, ops, constants, arguments, result))


def _in_block_order(members: list) -> list | None:
    """The chain's ops, each once, in the order of their block; None where they span blocks."""
    unique = list({op.operation: None for op in members})
    if len({op.block for op in unique}) != 1:
        return None
    order = {op.operation: i for i, op in enumerate(unique[0].block.operations)}
    return sorted(unique, key=lambda op: order[op])


def _used_values(op: ir.Operation) -> list:
    """The values `op` reads, its regions' ops included (a generic's body may read a constant
    defined above it), in order, each once."""
    from iree.compiler import ir

    seen: dict = {}
    local: set = set()

    def visit(inner: ir.Operation):
        for region in inner.regions:
            for block in region.blocks:
                local.update(block.arguments)
        local.update(inner.results)
        for v in inner.operands:
            seen.setdefault(v, None)
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return [v for v in seen if v not in local or v in op.operands]


def _inputs(ops: list, inside: set) -> tuple[list, list]:
    """(the chain's arguments, the constant-like ops outside it to clone in, producers first)."""
    arguments: dict = {}
    constants: dict = {}
    for op in ops:
        for v in _used_values(op):
            owner = _owner(v)
            if owner is not None and owner in inside:
                continue
            if owner is not None and _constant_like(owner, constants):
                continue
            arguments.setdefault(v, None)
    return list(arguments), list(constants)


def _owner(value: ir.Value) -> ir.Operation | None:
    from iree.compiler import ir

    owner = value.owner
    return None if isinstance(owner, ir.Block) else owner.operation


def _constant_like(op: ir.Operation, constants: dict) -> bool:
    """Whether `op`'s value is made of constants alone (a constant, an empty tensor, a fill of
    one): then it and its producers are cloned into the probe (added to `constants`, producers
    first). Nothing is added for an op that reads anything else."""
    found: dict = {}

    def made_of_constants(inner: ir.Operation) -> bool:
        if inner in constants or inner in found:
            return True
        if inner.name.startswith(_STATEFUL):
            return False
        for v in _used_values(inner):
            owner = _owner(v)
            if owner is None or not made_of_constants(owner):
                return False
        found[inner] = None
        return True

    if not made_of_constants(op):
        return False
    constants.update(found)
    return True


def _static_tensor(t: ir.Type) -> bool:
    """A ranked tensor of static sizes: what a probe takes and `flow.tensor.trace` traces
    without size operands."""
    try:
        return None not in tensor_facts(t).shape
    except ValueError:  # not a ranked tensor
        return False


def _probe_text(context: ir.Context, ops: list, constants: list, arguments: list, result: ir.Value) -> str:
    """`func.func @probe(arguments) -> result` with the constants and the chain cloned in."""
    from iree.compiler import ir
    from iree.compiler.dialects import func

    with context, ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            fn = func.FuncOp("probe", ([v.type for v in arguments], [result.type]))
            block = fn.add_entry_block()
        mapping = dict(zip(arguments, block.arguments))
        with ir.InsertionPoint(block):
            for op in [*constants, *ops]:
                clone = op.clone()
                _remap(clone, mapping)
                for old, new in zip(op.results, clone.results):
                    mapping[old] = new
            func.ReturnOp([mapping[result]])
        return module.operation.get_asm(enable_debug_info=False)


def _remap(op: ir.Operation, mapping: dict) -> None:
    """Points the operands of `op` and of its regions' ops at the probe's values."""
    from iree.compiler import ir

    def visit(inner: ir.Operation):
        for i, v in enumerate(inner.operands):
            if v in mapping:
                inner.operands[i] = mapping[v]
        return ir.WalkResult.ADVANCE

    op.operation.walk(visit)


# ------------------------------------------------------------------------ the capture module


def insert_traces(chains_by_probe: dict[str, Chain]) -> list:
    """`flow.tensor.trace "probe_K/argJ"` before the first chain op that reads argument J of
    each probe's first chain; returns the trace ops (to erase once the module is printed)."""
    from iree.compiler import ir
    from iree.compiler.dialects import flow

    traces = []
    for probe, chain in chains_by_probe.items():
        for j, value in enumerate(chain.arguments):
            user = next(op for op in chain.ops if value in _used_values(op))
            with ir.Location.unknown(user.context):
                traces.append(flow.TensorTraceOp(trace_key(probe, j), [value], [], ip=ir.InsertionPoint(user)))
    return traces


# ------------------------------------------------------------------------ probing a build


@dataclass(frozen=True)
class ProbeBuilt:
    """What the caller's build of one probe gave: its modules, and whether it replaced the op
    as the model's build did (else `note` says how it did not)."""

    vmfb: bytes | None
    baseline_vmfb: bytes | None
    note: str = ""


# (probe MLIR path, folder to build into, probe id, the model's decision) -> ProbeBuilt:
# pipeline.py's build_model, bound to the model build's projects and options.
ProbeBuilder = Callable[[Path, Path, str, Decision], ProbeBuilt]

# (folder to build into, probes' digests) -> (the model's module with those probes' ops left to
# IREE, or None, and why not): pipeline.py's build of the model itself, bound as ProbeBuilder is.
HeldOutBuilder = Callable[[Path, frozenset[str]], tuple[bytes | None, str]]

HELD_OUT_REASON = "left to IREE in the build tune times the model's build against (the probe's held-out build)"


def make_probes(
    name: str, model: Path, module: ir.Module, all_chains: Sequence[Chain], stage: Path, build_probe: ProbeBuilder,
    compile_capture: Callable[[str], bytes], build_held_out: HeldOutBuilder,
) -> dict[str, bytes]:
    """The probe files of a model build ({name: bytes}, the probe record last): per distinct
    chain its MLIR and both builds, for kinds timed in the model the model without them
    (held_out_builds), the capture module, and the record."""
    distinct: dict[str, list[Chain]] = {}
    for chain in all_chains:
        if not chain.why_not:
            distinct.setdefault(chain.text, []).append(chain)
    files: dict[str, bytes] = {}
    probes, firsts = [], {}
    for k, group in enumerate(distinct.values()):
        pid = f"probe_{k}"
        first = group[0]
        firsts[pid] = first
        mlir = f"{name}.{pid}.mlir"
        files[mlir] = first.text.encode()
        (stage / mlir).write_bytes(files[mlir])
        built = build_probe(stage / mlir, stage / pid, pid, first.decision)
        status = "built" if built.vmfb is not None else "unmatched"
        vmfb = baseline = None
        if status == "built":
            vmfb, baseline = f"{name}.{pid}.vmfb", f"{name}.{pid}.baseline.vmfb"
            files[vmfb], files[baseline] = built.vmfb, built.baseline_vmfb
        probes.append(_probe(pid, first, group, mlir, vmfb, baseline, status, built.note))
    probes = held_out_builds(name, probes, stage, build_held_out, files)
    traces = insert_traces({p.id: firsts[p.id] for p in probes if p.status == "built"})
    try:
        text = module.operation.get_asm(enable_debug_info=True)
    finally:
        for t in traces:
            t.operation.erase()
    capture = f"{name}.capture.vmfb"
    files[capture] = compile_capture(text)
    record = ProbeRecord(
        name=name, model=str(model), model_sha256=model_sha256(model), capture_vmfb=capture, probes=tuple(probes),
        files={n: sha256(d) for n, d in files.items()},
        without_probe=tuple((c.decision.op.location, c.why_not) for c in all_chains if c.why_not),
    )
    files[probes_record_name(name)] = record.to_bytes()
    return files


def held_out_builds(name: str, probes: list[Probe], stage: Path, build_held_out: HeldOutBuilder, files: dict[str, bytes]) -> list[Probe]:
    """`probes` with their held-out builds: for the built probes of kinds timed in the model,
    one build of the whole model per kind, kernel and shape (`NAME.heldout_K.vmfb`, added to
    `files`) with every op of those probes left to IREE. A model's layers give such probes one
    each (their norms' weights differ): one build stands for them all, and tune decides for them
    together."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(probes):
        if p.status == "built" and OP_KINDS[p.op].timed_in_model:
            groups.setdefault((p.op, p.kernel_entry, p.arguments, p.result), []).append(i)
    out = list(probes)
    for k, members in enumerate(groups.values()):
        module, note = build_held_out(stage / f"heldout_{k}", frozenset(probes[i].digest for i in members))
        held_out = None
        if module is not None:
            held_out = f"{name}.heldout_{k}.vmfb"
            files[held_out] = module
        for i in members:
            out[i] = dataclasses.replace(probes[i], heldout_vmfb=held_out, heldout_note=note)
    return out


def _probe(pid: str, first: Chain, group: list[Chain], mlir: str, vmfb: str | None, baseline: str | None, status: str, note: str) -> Probe:
    d = first.decision
    return Probe(
        id=pid, digest=first.digest, op=d.op.kind, locations=tuple(c.decision.op.location for c in group), kernel=d.kernel.name,
        kernel_entry=d.kernel.entry, arithmetic=d.kernel.replaces.arithmetic, arguments=tuple(tensor_facts(v.type) for v in first.arguments),
        result=d.op.result, status=status, mlir=mlir, vmfb=vmfb, baseline_vmfb=baseline, note=note,
    )


def model_sha256(model: Path) -> str:
    h = hashlib.sha256()
    with open(model, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def same_kernel(model: Decision, probe: Sequence[Decision]) -> str:
    """Why the probe's own build did not replace it as the model's did ("" where it did)."""
    replaced = [d for d in probe if d.kernel is not None]
    if len(replaced) != 1:
        return f"the probe's own build replaced {len(replaced)} op(s), not 1"
    mine = replaced[0]
    if mine.kernel.name != model.kernel.name or mine.call.marked != model.call.marked:
        return f"the probe's own build chose {mine.kernel.name} (with {mine.call.marked} op(s) after it), the model's {model.kernel.name} (with {model.call.marked})"
    return ""


# ------------------------------------------------------------------------ a tuned build


@dataclass(frozen=True)
class Tuning:
    """What a tune record changed in a build: the report's `tune` field."""

    file: str
    tuned: tuple[dict, ...]  # {location, probe, kernel, decision, reason} per op the record covers
    untuned: tuple[str, ...]  # locations of replaced ops it does not cover (the rule decides them)

    def to_json(self) -> dict:
        return {"file": self.file, "tuned": list(self.tuned), "untuned": list(self.untuned)}

    def lines(self) -> list[str]:
        lines = [f"tuned by {self.file}: {len(self.tuned)} op(s); {len(self.untuned)} replaced op(s) it does not cover follow the rule"]
        lines += [f"  {t['decision']:<8}  {t['location']}: {t['reason']}" for t in self.tuned]
        return lines


def tune_reason(entry: object) -> str:
    """Why tune decided as it did, as the build report says it."""
    if entry.agree is False:
        return f"tune: outputs differ by {entry.max_abs_error:.3g} ({entry.tolerance}) on the model's activations"
    if entry.timed_in_model:
        return f"tune: the model {entry.model_us:.1f} us with the kit's kernel vs {entry.heldout_us:.1f} us without it (device time a call)"
    if entry.kit_us is not None and entry.iree_us is not None:
        return f"tune: kit {entry.kit_us:.1f} us vs IREE {entry.iree_us:.1f} us on the model's activations"
    return f"tune: {entry.reason}"


def apply_tune(
    record: TuneRecord, path: Path, model: Path, found: Sequence[tuple[object, object]], settled: Sequence[Decision], context: ir.Context,
) -> tuple[dict[int, Decision], tuple[dict, ...]]:
    """The decisions a tune record overrides ({index in found: kept Decision}) and, per op it
    covers (by index in found), what it decided: {index, location, probe, kernel, decision,
    reason}. A record of another model or another build (its model hash differs, or a probe it
    measured is no chain of this build) is refused."""
    if record.model_sha256 != model_sha256(model):
        raise UsageError(
            f"the tune file {path} was measured on another model ({record.model}), not {model}",
            where=str(path),
            fix="run kitdispatch tune on a build of this model (build --model M -o DIR --probes, then tune DIR)",
        )
    by_digest = _chains_by_digest(found, settled, context)
    stray = [e.probe for e in record.entries if e.digest not in by_digest]
    if stray:
        raise UsageError(
            f"the tune file {path} does not match this build: its {', '.join(stray)} match no replaced op of {model}",
            where=str(path),
            fix="tune the build made with the same projects and options (build --probes, then tune DIR), or build without --tuned",
        )
    overrides, tuned = {}, []
    for e in record.entries:
        for i, chain in by_digest[e.digest]:
            reason = tune_reason(e)
            tuned.append({"index": i, "location": chain.decision.op.location, "probe": e.probe, "kernel": e.kernel, "decision": e.decision, "reason": reason})
            if e.decision == "keep":
                overrides[i] = Decision(chain.decision.op, None, reasons=(reason,))
    return overrides, tuple(tuned)


def _chains_by_digest(found: Sequence[tuple[object, object]], settled: Sequence[Decision], context: ir.Context) -> dict[str, list[tuple[int, Chain]]]:
    """The replaced ops' chains by their probe's digest: (index in found, chain)."""
    by_digest: dict[str, list[tuple[int, Chain]]] = {}
    for i, ((op, _), d) in enumerate(zip(found, settled)):
        if d.kernel is not None:
            chain = _chain(op, d, context)
            if not chain.why_not:
                by_digest.setdefault(chain.digest, []).append((i, chain))
    return by_digest


def hold_out(digests: frozenset[str], found: Sequence[tuple[object, object]], settled: Sequence[Decision], context: ir.Context) -> dict[int, Decision]:
    """The decisions that leave every op of the probes `digests` to IREE ({index in found:
    kept Decision}): the held-out build of those probes."""
    by_digest = _chains_by_digest(found, settled, context)
    return {i: Decision(chain.decision.op, None, reasons=(HELD_OUT_REASON,)) for d in digests for i, chain in by_digest.get(d, ())}


def tuning_of(path: Path, tuned: Sequence[dict], decisions: Sequence[Decision]) -> Tuning:
    """The report's account of a tuned build: what tune decided, and the replaced ops (by the
    final decisions) it did not cover, which the rule decided."""
    covered = {t["index"] for t in tuned}
    untuned = tuple(d.op.location for i, d in enumerate(decisions) if d.kernel is not None and i not in covered)
    return Tuning(str(path), tuple({k: v for k, v in t.items() if k != "index"} for t in tuned), untuned)


__all__ = [
    "Chain", "HeldOutBuilder", "ProbeBuilder", "ProbeBuilt", "Tuning", "apply_tune", "chains", "held_out_builds", "hold_out", "make_probes",
    "model_sha256", "same_kernel", "tuning_of",
]
