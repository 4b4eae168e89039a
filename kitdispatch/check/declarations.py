"""A kernel's parameter types as the compiler resolved them, checked against its description.

The source's signature is checked when the manifest loads (spec.check_params), through the
typedefs the signature parser can resolve. What only the compiler knows is checked here,
after compiling: a template's `T`, a typedef that `#if` branches or `-D` flags choose, a type
behind a macro.

- A C++ kernel's mangled entry spells its parameter types (signature.compiled_signature).
- An `extern "C"` kernel's entry does not, so when a pointer's element type is a name the
  parser could not resolve, NVRTC compiles the source once more inside a wrapper with a
  `__global__` template instantiated on `decltype(&kernel)`; NVRTC's lowered name for it
  spells the function type: `void __kitdispatch_types<void (*)(__nv_bfloat16*, int)>()`.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from kitdispatch._files import read_regular_file
from kitdispatch.describe.abi import pointee
from kitdispatch.compile.archs import Arch
from kitdispatch.compile.compilers import CompileOptions, NvrtcCompiler
from kitdispatch.errors import KitError, ManifestError
from kitdispatch.describe.c_signature import KernelSignature, compiled_signature, find_kernel
from kitdispatch.describe.kernel import Kernel
from kitdispatch.describe.reconcile import check_params
from kitdispatch.describe.names import cpp_base_name

PROBE = "__kitdispatch_types"


def check_compiled_types(kernel: Kernel, source: Path, arch: Arch, options: CompileOptions, where: str, *, timeout: float) -> None:
    """The declared params against the compiler's types, where the source did not say them
    plainly (`options`: the source's compile options; NVRTC runs the probe of an extern "C"
    kernel, whatever compiler builds it)."""
    if kernel.cpp_name:
        compiled = compiled_signature(kernel.name, kernel.entry)
    else:
        compiled = _probed(kernel, source, arch, options, timeout)
    if compiled is not None:
        check_params(kernel.params, compiled, where)


def _probed(kernel: Kernel, source: Path, arch: Arch, options: CompileOptions, timeout: float) -> KernelSignature | None:
    """The extern "C" kernel's signature through the NVRTC probe, when a pointer's element
    type is a name the source's parser did not resolve; None otherwise or where the probe
    cannot run (the kernel itself has compiled: a probe failure changes nothing)."""
    if not _has_unresolved_pointee(kernel, source) or any(c in str(source.resolve()) for c in '"\\\n\r'):
        return None
    probe = f"{PROBE}<decltype(&{kernel.name})>"
    with tempfile.TemporaryDirectory(prefix="kitdispatch-types-") as tmp:
        wrapper = Path(tmp) / f"{source.stem}.types.cu"
        wrapper.write_text(f'#include "{source.resolve()}"\ntemplate <class F> __global__ void {PROBE}() {{}}\n')
        opts = dataclasses.replace(
            options, include_dirs=(*options.include_dirs, str(source.parent)), name_expressions=(probe,), bridges=()
        )
        try:  # uncached: the wrapper's text does not change with the source it includes
            lowered = dict(NvrtcCompiler(timeout=timeout).compile(wrapper, arch, "ptx", opts).lowered)
        except KitError:
            return None
    mangled = lowered.get(probe)
    return compiled_signature(kernel.name, mangled, template_argument=True) if mangled else None


def _has_unresolved_pointee(kernel: Kernel, source: Path) -> bool:
    try:
        sig = find_kernel(read_regular_file(source).decode(), cpp_base_name(kernel.name), path=str(source))
    except (ManifestError, OSError, UnicodeDecodeError, ValueError):
        return False  # the load reported what it could; the compile succeeded
    return any(c.is_pointer and pointee(c.base_type) is None for c in sig.params)
