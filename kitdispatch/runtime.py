"""Running built modules on IREE's cuda device: the iree.runtime API and iree-run-module.

Needs only iree-base-runtime and numpy, the way users deploy: build on one machine, run
on the GPU box.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._proc import ToolResult, run_tool
from .errors import KitError, RuntimeUnavailable, ToolError
from .record import RECORD_SUFFIX, BuildRecord, read_record, record_beside  # noqa: F401 (RECORD_SUFFIX: API)
from . import abi
from .spec import FunctionSignature, ScalarType

RUN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class DeviceStatus:
    available: bool
    reason: str  # what was found, or why there is no device


def cuda_status(device: str = "cuda") -> DeviceStatus:
    """Whether IREE's cuda driver can open a device here, and if not, why."""
    try:
        import iree.runtime as rt
    except ImportError as exc:
        return DeviceStatus(False, f"iree-base-runtime is not installed ({exc})")
    try:
        driver = rt.get_driver(device.split("://")[0])
        devices = driver.query_available_devices()
    except Exception as exc:  # the binding raises RuntimeError/ValueError with IREE's status text
        return DeviceStatus(False, f"IREE's cuda driver cannot start: {str(exc).strip()}")
    if not devices:
        return DeviceStatus(False, "IREE's cuda driver found no CUDA device")
    names = ", ".join(str(d.get("name", d)) for d in devices)
    return DeviceStatus(True, f"{len(devices)} CUDA device(s): {names}")


def require_cuda(device: str = "cuda") -> None:
    status = cuda_status(device)
    if not status.available:
        raise RuntimeUnavailable(
            f"no CUDA device: {status.reason}",
            fix="run on a machine with an NVIDIA GPU and driver; building works without one",
        )


def read_record_of(vmfb: Path) -> BuildRecord | None:
    """The build record next to the .vmfb, after checking the .vmfb is the one it describes;
    None for modules built without kitdispatch (no record beside them)."""
    path = record_beside(vmfb)
    if not path.exists():
        return None
    record = read_record(path)
    record.check_file(vmfb.parent, vmfb.name)
    return record


def read_signatures(vmfb: Path) -> dict[str, FunctionSignature]:
    record = read_record_of(vmfb)
    return {f.name: f for f in record.functions} if record else {}


def preflight_run(vmfb: Path, record: BuildRecord | None = None) -> None:
    """Before loading: a PTX-only module must not need a newer PTX ISA than this driver has."""
    from .preflight import Version, check_ptx_loads, local_driver

    record = record if record is not None else read_record_of(vmfb)
    needed = record.ptx_isa if record else None
    driver = local_driver()
    if needed and driver:
        check_ptx_loads(Version.parse(needed), driver, compiler="built", where=str(vmfb))


class Module:
    """A .vmfb loaded on a device; call its functions with numpy arrays, get numpy back."""

    def __init__(self, vmfb: str | Path, *, device: str = "cuda"):
        import iree.runtime as rt

        self.path = Path(vmfb)
        if not self.path.is_file():
            raise KitError(f"no module at {self.path}", fix="build it first: kitdispatch build ... -o DIR")
        record = read_record_of(self.path)
        require_cuda(device)
        preflight_run(self.path, record)
        self.device = device
        self.signatures = {f.name: f for f in record.functions} if record else {}
        config = rt.Config(device=rt.get_device(device))
        self.hal_device = config.device  # for rt.asdevicearray: inputs that stay on the GPU
        self._context = rt.SystemContext(config=config)
        vm_module = rt.VmModule.mmap(config.vm_instance, str(self.path))
        self._context.add_vm_module(vm_module)
        self._functions = self._context.modules[vm_module.name]
        self.name = vm_module.name

    @property
    def function_names(self) -> tuple[str, ...]:
        return tuple(self.signatures) if self.signatures else ()

    def raw(self, name: str):
        """IREE's own callable: no argument checks, and it takes device arrays
        (`iree.runtime.asdevicearray(module.hal_device, x)`) as well as numpy."""
        try:
            return self._functions[name]
        except (KeyError, AttributeError):
            known = ", ".join(self.function_names) or "see `iree-dump-module`"
            raise KitError(f"{self.path} has no function {name!r}", fix=f"call one of: {known}") from None

    def __getitem__(self, name: str):
        return functools.partial(self.call, name)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def call(self, name: str, *args):
        """Calls `name`; returns one numpy array, or a tuple for several results."""
        sig = self.signatures.get(name)
        if sig is not None:
            args = check_arguments(sig, args)
        results = self.raw(name)(*args)
        if isinstance(results, (list, tuple)):
            return tuple(_to_numpy(r) for r in results)
        return _to_numpy(results)


def load_module(vmfb: str | Path, *, device: str = "cuda") -> Module:
    return Module(vmfb, device=device)


def check_arguments(sig: FunctionSignature, args: Sequence) -> list:
    """Checks count, dtype, rank, static dims and shared symbols before IREE sees them."""
    if len(args) != len(sig.args):
        raise KitError(
            f"{sig.name} takes {len(sig.args)} arguments ({', '.join(map(str, sig.args))}), got {len(args)}",
            fix="pass one numpy array per tensor argument and one number per scalar",
        )
    bound: dict[str, int] = {}
    out = []
    for i, (want, got) in enumerate(zip(sig.args, args)):
        where = f"{sig.name} argument {i} ({want})"
        if isinstance(want, ScalarType):
            value = scalar_argument(want.dtype, got, where)
            out += value if isinstance(value, tuple) else [value]  # a struct: its words
            continue
        arr = np.asarray(got)
        want_dtype = numpy_dtype(want.dtype)
        if arr.dtype != want_dtype:
            raise KitError(f"{where}: got dtype {arr.dtype}", fix=f"pass a {want_dtype} array (arr.astype(...))")
        if arr.ndim != len(want.shape):
            raise KitError(f"{where}: got shape {arr.shape}", fix=f"pass a rank-{len(want.shape)} array")
        for dim, size in zip(want.shape, arr.shape):
            if isinstance(dim, int) and dim != size:
                raise KitError(f"{where}: got shape {arr.shape}", fix=f"dimension must be {dim}")
            if isinstance(dim, str) and bound.setdefault(dim, size) != size:
                raise KitError(
                    f"{where}: {dim} = {size} here but {bound[dim]} in an earlier argument",
                    fix=f"give every argument the same size for {dim}",
                )
        out.append(np.ascontiguousarray(arr))
    return out


def scalar_argument(dtype: str, value, where: str = "scalar") -> int | float | tuple[int, ...]:
    """A Python or numpy scalar as the generated function takes it (abi.argument), range-checked."""
    try:
        return abi.argument(abi.lookup(dtype), value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise KitError(f"{where}: {exc}", fix=f"pass a number that fits {dtype}") from None


def numpy_dtype(dtype: str) -> np.dtype:
    return abi.lookup(dtype).dtype


def _to_numpy(value):
    return value.to_host() if hasattr(value, "to_host") else np.asarray(value)


# ---------------------------------------------------------------------- iree-run-module


@functools.cache
def find_runtime_tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    try:
        import iree._runtime_libs as libs
    except ImportError:
        raise KitError(f"{name} is not installed", fix="pip install iree-base-runtime") from None
    path = Path(libs.__file__).parent / name
    if not path.is_file():
        raise KitError(f"{name} is missing from iree-base-runtime", fix="reinstall iree-base-runtime")
    return str(path)


def run_module(
    vmfb: str | Path,
    function: str,
    inputs: Sequence[str],
    *,
    device: str = "cuda",
    extra: Sequence[str] = (),
    timeout: float = RUN_TIMEOUT_S,
) -> ToolResult:
    """Runs one function through iree-run-module with IREE's --input syntax (e.g. 8xf32=2)."""
    vmfb = Path(vmfb)
    if not vmfb.is_file():
        raise KitError(f"no module at {vmfb}", fix="build it first: kitdispatch build ... -o DIR")
    require_cuda(device)
    preflight_run(vmfb)
    argv = [
        find_runtime_tool("iree-run-module"),
        f"--device={device}",
        f"--module={vmfb}",
        f"--function={function}",
        *(f"--input={i}" for i in inputs),
        *extra,
    ]
    res = run_tool(argv, timeout=timeout)
    if res.returncode != 0:
        raise ToolError(
            f"iree-run-module failed running {function}",
            where=str(vmfb),
            argv=argv,
            returncode=res.returncode,
            log=res.stderr + res.stdout,
            fix="check the function name and the inputs' shapes and types",
        )
    return res
