"""Value types: tensors (`f16[m,k]`) and scalars (`i32`), as manifests and the API write them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from kitdispatch.describe import abi
from kitdispatch.errors import ManifestError
from kitdispatch.describe.limits import MAX_STATIC_DIM
from kitdispatch.describe.names import check_identifier


_TENSOR_RE = re.compile(r"^\s*([a-z0-9]+)\s*\[(.*)\]\s*\Z", re.S)


def float_bits(dtype: str, value: float) -> int:
    """The bits of `value` as a float of type `dtype` (rounded to nearest even), unsigned."""
    return abi.bits(abi.lookup(dtype), value)


@dataclass(frozen=True)
class TensorType:
    """An element type and a shape whose entries are ints (static) or symbol names."""

    dtype: str
    shape: tuple[int | str, ...]

    @classmethod
    def parse(cls, text: object, where: str) -> "TensorType":
        if not isinstance(text, str) or not (m := _TENSOR_RE.match(text)):
            raise ManifestError(
                f"{text!r} is not a tensor type",
                where=where,
                fix="write it as DTYPE[DIMS], e.g. 'f32[n]', 'f16[m,k]', 'f32[4,n]' or 'f32[]'",
            )
        dtype, dims_text = m.group(1), m.group(2).strip()
        check_element_type(dtype, where)
        dims: list[int | str] = []
        for dim in (d.strip() for d in dims_text.split(",")) if dims_text else ():
            if dim.isascii() and dim.isdigit():
                if int(dim) > MAX_STATIC_DIM:
                    raise ManifestError(
                        f"dimension {dim} of {text!r} is larger than {MAX_STATIC_DIM}", where=where,
                        fix="use a dimension name for sizes known only at run time",
                    )
                dims.append(int(dim))
            else:
                dims.append(check_identifier(dim, "dimension", where))
        return cls(dtype, tuple(dims))

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(d for d in self.shape if isinstance(d, str))

    @property
    def mlir_types(self) -> tuple[str, ...]:
        """The function arguments it takes: one tensor."""
        return (self.mlir,)

    @property
    def mlir(self) -> str:
        dims = "".join(f"{'?' if isinstance(d, str) else d}x" for d in self.shape)
        return f"tensor<{dims}{abi.lookup(self.dtype).mlir}>"

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class ScalarType:
    dtype: str

    @property
    def mlir(self) -> str:
        """The type a generated function takes for this scalar (abi.AbiType.argument)."""
        return abi.lookup(self.dtype).argument

    @property
    def mlir_types(self) -> tuple[str, ...]:
        """The function arguments it takes: one, or one i32 per word of a struct."""
        return abi.lookup(self.dtype).arguments

    def __str__(self) -> str:
        return self.dtype


def check_element_type(dtype: str, where: str) -> None:
    abi.element_type(dtype, where)


def parse_value_type(text: object, where: str) -> TensorType | ScalarType:
    """'f32[n]' is a tensor; a bare 'f32' or 'i32' is a scalar."""
    if isinstance(text, str) and "[" not in text:
        dtype = text.strip()
        abi.scalar_type(dtype, where, ", or DTYPE[DIMS] for a tensor")
        return ScalarType(dtype)
    return TensorType.parse(text, where)


@dataclass(frozen=True)
class FunctionSignature:
    """What a function of the built module takes and returns."""

    name: str
    args: tuple[TensorType | ScalarType, ...]
    results: tuple[TensorType | ScalarType, ...]
    arg_names: tuple[str, ...] = ()  # a generated function's parameter names; () if unknown

    def to_json(self) -> dict:
        data = {
            "name": self.name,
            "args": [str(a) for a in self.args],
            "results": [str(r) for r in self.results],
        }
        return data | ({"arg_names": list(self.arg_names)} if self.arg_names else {})

    @classmethod
    def from_json(cls, data: dict, where: str) -> "FunctionSignature":
        names = tuple(data.get("arg_names", ()))
        if names and (len(names) != len(data["args"]) or not all(isinstance(n, str) for n in names)):
            raise ManifestError(f"function {data['name']!r} has arg_names that do not fit its args", where=where, fix="rebuild")
        return cls(
            data["name"],
            tuple(parse_value_type(a, where) for a in data["args"]),
            tuple(parse_value_type(r, where) for r in data["results"]),
            names,
        )
