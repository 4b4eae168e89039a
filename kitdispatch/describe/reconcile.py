"""Declared parameters against the kernel's C signature: what a manifest leaves out is inferred
from the source, what it says is checked against it."""

from __future__ import annotations

import dataclasses
import re
from kitdispatch.describe import abi
from kitdispatch.errors import ManifestError
from kitdispatch.describe.c_signature import CParam, KernelSignature
from kitdispatch.describe.index_expr import IndexExpr
from kitdispatch.describe.kernel import Buffer, Param, Scalar, c_slots
from kitdispatch.describe.names import WIDE_HALVES
from kitdispatch.describe.types import TensorType


def infer_params(
    sig: KernelSignature,
    *,
    shapes: dict[str, TensorType],
    inout: tuple[str, ...] = (),
    inputs: tuple[str, ...] = (),
    outputs: tuple[str, ...] = (),
    scalars: dict[str, str] | None = None,
    values: dict[str, IndexExpr | float] | None = None,
    where: str,
) -> tuple[Param, ...]:
    """The layout from the kernel's C signature: a const pointer is an `in` buffer, one listed
    in `inout`, `in` or `out` has that role, and any other pointer is provisionally `out`
    until the build reads its loads and stores in the compiled code (roles.py); scalar types
    come from the C types, or from `scalars` for what C cannot say (a 64-bit value's two
    halves, a struct)."""
    scalars, values = dict(scalars or {}), dict(values or {})
    for name, dtype in scalars.items():
        abi.scalar_type(dtype, f"{where}: scalars.{name}", " (C's int is i32, float is f32)")
    _check_listed(shapes, [c.name for c in sig.params if c.is_pointer], sig, "shapes", "pointer", where)
    _check_listed(dict.fromkeys(inout + inputs + outputs), [c.name for c in sig.params if c.is_pointer], sig,
                  "inout/in/out", "pointer", where)
    twice = [n for n in dict.fromkeys(inout + inputs + outputs) if (n in inout) + (n in inputs) + (n in outputs) > 1]
    if twice:
        raise ManifestError(f"pointer {twice[0]!r} is listed in more than one of inout, in and out", where=where,
                            fix="give each pointer one role")
    for name in outputs:
        c = next(c for c in sig.params if c.name == name)
        if c.is_const_pointee:
            raise _mismatch(sig, name, "out (written)", f"'{c.type}' (const: read-only)", where)
    c_names = [c.name for c in sig.params]
    wide_halves = {
        n + WIDE_HALVES[0]: n for n, t in scalars.items()
        if abi.lookup(t).words == 2 and n not in c_names and n + WIDE_HALVES[0] in c_names
    }
    scalar_names = [c.name for c in sig.params if not c.is_pointer]
    known = scalar_names + list(wide_halves.values())
    _check_listed(scalars, known, sig, "scalars", "scalar", where)
    _check_listed(values, known, sig, "values", "scalar", where)
    params: list[Param] = []
    i = 0
    while i < len(sig.params):
        c = sig.params[i]
        pwhere = f"{where}: parameter {c.name or i} of {sig.name}"
        if not c.name:
            raise ManifestError(
                f"parameter {i} of kernel {sig.name!r} has no name", where=pwhere,
                fix="name every parameter in the kernel's definition, or declare 'params' explicitly",
            )
        if c.is_pointer:
            if c.name not in shapes:
                raise ManifestError(
                    f"pointer {c.name!r} of kernel {sig.name!r} has no shape", where=pwhere,
                    fix=f'add it to shapes, e.g. shapes = {{ {c.name} = "f32[n]" }}',
                )
            access = "inout" if c.name in inout else "in" if c.name in inputs or c.is_const_pointee else "out"
            if c.name in inout and c.is_const_pointee:
                raise _mismatch(sig, c.name, "inout (written)", f"'{c.type}' (const: read-only)", pwhere)
            named = c.name in inout or c.name in inputs or c.name in outputs or c.is_const_pointee
            params.append(Buffer(c.name, access, shapes[c.name], inferred=not named))
            i += 1
            continue
        if c.name in wide_halves:
            name = wide_halves[c.name]
            params.append(Scalar(name, scalars[name], values.get(name), split=True))
            i += 2  # the pair is checked against the signature below
            continue
        dtype = scalars.get(c.name) or _c_scalar_type(sig, c, pwhere)
        params.append(Scalar(c.name, dtype, values.get(c.name)))
        i += 1
    params = tuple(params)
    check_params(params, sig, where)
    return params


def _check_listed(table: dict, names: list[str], sig: KernelSignature, key: str, what: str, where: str) -> None:
    for name in table:
        if name not in names:
            raise ManifestError(
                f"{key} names {name!r}, which is not a {what} parameter of kernel {sig.name!r}",
                where=where,
                fix=f"{what} parameters of {sig.name}: {', '.join(names) or 'none'}",
            )


def _value_type(c: CParam) -> str:
    """A by-value parameter's C type without qualifiers (`const long long` -> `long long`)."""
    return c.base_type if "*" not in c.type and "&" not in c.type else c.type


def _c_scalar_type(sig: KernelSignature, c: CParam, where: str) -> str:
    row = abi.BY_C_NAME.get(_value_type(c))
    if row is not None and row.scalar:
        return row.name
    if _value_type(c) in abi.C_UNSUPPORTED:
        raise ManifestError(
            f"parameter {c.name!r} of kernel {sig.name!r} has C type '{c.type}', which no push "
            "constant carries",
            where=where,
            fix=f"take it as one of the scalar types ({', '.join(abi.SCALAR_TYPES)})",
        )
    raise ManifestError(
        f"parameter {c.name!r} of kernel {sig.name!r} has C type '{c.type}', which kitdispatch "
        "cannot map to a scalar type",
        where=where,
        fix=f"declare its type: scalars = {{ {c.name} = \"f32\" }} (one of {', '.join(abi.SCALAR_TYPES)}), "
        f"or {{ {c.name} = \"struct16\" }} for a struct of 16 bytes passed by value",
    )


def with_split_halves(params: tuple[Param, ...], sig: KernelSignature) -> tuple[Param, ...]:
    """Explicit params: a 64-bit scalar NAME whose kernel takes NAME_lo, NAME_hi (and no
    NAME) is split into those halves."""
    names = {c.name for c in sig.params}
    return tuple(
        dataclasses.replace(p, split=True)
        if isinstance(p, Scalar) and p.words == 2 and p.name not in names and p.name + WIDE_HALVES[0] in names
        else p
        for p in params
    )


def check_params(params: tuple[Param, ...], sig: KernelSignature, where: str) -> None:
    """The declared layout against the C signature: count, names, pointer or scalar,
    const-ness, scalar C types and pointer element types."""
    slots = c_slots(params)
    c_names = [c.name for c in sig.params]
    if len(slots) != len(sig.params):
        raise ManifestError(
            f"kernel {sig.name!r} takes {len(sig.params)} parameters in its source "
            f"({', '.join(c.name or '?' for c in sig.params)}) but the manifest fills {len(slots)} "
            f"({', '.join(s.name for s in slots)})",
            where=where,
            fix="declare every C parameter, in order; a 64-bit scalar NAME may fill NAME_lo and NAME_hi",
        )
    for slot, c in zip(slots, sig.params):
        p = slot.param
        declared = (
            f"{p.access} {p.type}" if isinstance(p, Buffer) else
            f"{p.dtype} half {slot.name!r}" if p.split else f"scalar {p.dtype}"
        )
        # A name the signature does not use renames the parameter (the generated function's
        # argument); one that names another C parameter means the order is wrong.
        if c.name and c.name != slot.name and slot.name in c_names:
            raise _mismatch(sig, slot.name, f"{declared} named {slot.name!r} at position {c_names.index(c.name)}",
                            f"'{c.type} {c.name}' there and {slot.name!r} at position "
                            f"{c_names.index(slot.name)}", where)
        if isinstance(p, Buffer) != c.is_pointer:
            raise _mismatch(sig, slot.name, declared, f"'{c.type}' ({'a pointer' if c.is_pointer else 'by value'})", where)
        if isinstance(p, Buffer):
            if c.is_const_pointee and p.is_result:
                raise _mismatch(sig, p.name, declared, f"'{c.type}' (const: the kernel cannot write it)", where)
            _check_pointee(sig, c, p, declared, where)
            if c.type.count("*") > 1:
                raise _mismatch(sig, p.name, declared, f"'{c.type}' (a pointer to pointers)", where)
            continue
        row = abi.BY_C_NAME.get(_value_type(c))
        if p.split:
            ok = _unknown_c_type(c) or (row is not None and row.is_integer and row.size == 4)
        else:
            ok = row == p.abi or _unknown_c_type(c)
        if not ok:
            want = "a 32-bit integer half" if p.split else abi.c_spellings(p.dtype)
            raise _mismatch(sig, slot.name, f"{declared} ({want})", f"'{c.type}'", where)


def _check_pointee(sig: KernelSignature, c: CParam, p: Buffer, declared: str, where: str) -> None:
    """A pointer's element type as C states it (through typedefs; a vector type's lanes) against
    the declared tensor; a type the ABI table does not know (a struct, a template's T) is not
    checked here, but after compiling, on the compiler's types (check/declarations.py)."""
    found = abi.pointee(c.base_type)
    if found is None:
        return
    element, lanes = found
    alias = "" if re.search(rf"(?<!\w){re.escape(c.base_type)}(?!\w)", c.type) else f"a typedef of {c.base_type}: "
    what = f"{alias}elements of type {element.name}" + (f", {lanes} at a time" if lanes > 1 else "")
    if not abi.holds(element, abi.lookup(p.type.dtype)):
        raise _mismatch(sig, p.name, declared, f"'{c.type}' ({what})", where)
    inner = p.type.shape[-1] if p.type.shape else 1
    if lanes > 1 and isinstance(inner, int) and inner % lanes:
        raise ManifestError(
            f"kernel {sig.name!r} parameter {p.name!r}: '{c.type}' ({what}) but the innermost dimension "
            f"of {p.type} is {inner}, not a multiple of {lanes}",
            where=where,
            fix=f"declare the tensor in {element.name} elements with an innermost dimension that is a "
            f"multiple of {lanes}, e.g. {element.name}[n,{lanes}] or {element.name}[n] with n a multiple of {lanes}",
        )


def _unknown_c_type(c: CParam) -> bool:
    """A typedef or template parameter the kit cannot see through: not checked."""
    c_type = _value_type(c)
    return c_type not in abi.BY_C_NAME and c_type not in abi.C_UNSUPPORTED and "*" not in c_type


def _mismatch(sig: KernelSignature, param: str, declared: str, source: str, where: str) -> ManifestError:
    origin = f"the source (line {sig.line})" if sig.line else "the compiled kernel"  # line 0: signature.compiled_signature
    return ManifestError(
        f"kernel {sig.name!r} parameter {param!r}: the manifest declares {declared}, {origin} has {source}",
        where=where,
        fix="make the manifest match the kernel's C signature, or leave 'params' out to infer it",
    )
