"""Running built modules on IREE's cuda device: the iree.runtime API and iree-run-module.

Needs only iree-base-runtime and numpy, the way users deploy: build on one machine, run
on the GPU box.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from kitdispatch.run.device import get_device
from kitdispatch.errors import IREE_STATUS_ERRORS, KitError, RuntimeUnavailable, UsageError
from kitdispatch.describe.record import BuildRecord, read_record, record_beside
from kitdispatch.describe.names import ASYNC_SUFFIX, RECORDING_SUFFIX, TRANSIENTS_SIZE_KEY, TRANSIENTS_SUFFIX
from kitdispatch.describe.types import FunctionSignature
from kitdispatch.run.driver_ptx import Version, check_ptx_loads, local_driver
from kitdispatch.run.function import Function
from kitdispatch.run.model import ModelEntry, model_build, model_signature

if TYPE_CHECKING:
    from iree.runtime import FunctionInvoker, VmFunction

    from kitdispatch.describe.model_record import ModelRecord


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
    name = _driver_name(device)
    try:
        driver = rt.get_driver(name)
        devices = driver.query_available_devices()
    except Exception as exc:  # the binding raises RuntimeError/ValueError with IREE's status text
        return DeviceStatus(False, f"IREE's {name} driver cannot start: {str(exc).strip()}")
    if not devices:
        return DeviceStatus(False, f"IREE's {name} driver found no device")
    names = ", ".join(str(d.get("name", d)) for d in devices)
    kind = "CUDA" if name == "cuda" else name
    return DeviceStatus(True, f"{len(devices)} {kind} device(s): {names}")


def _driver_name(device: str) -> str:
    return device.split("://")[0]


def check_device_uri(device: str) -> None:
    """A device URI must name a driver IREE's runtime has: a typo is bad input, not a missing GPU.
    Without the runtime there is nothing to check (cuda_status says it is missing)."""
    try:
        import iree.runtime as rt
    except ImportError:
        return
    drivers = rt.query_available_drivers()
    if not isinstance(device, str) or _driver_name(device) not in drivers:
        raise UsageError(
            f"IREE's runtime has no device {device!r}",
            fix=f"use cuda (or cuda://N for GPU N); the drivers here: {', '.join(drivers)}",
        )


def require_cuda(device: str = "cuda") -> None:
    check_device_uri(device)
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
    record = record if record is not None else read_record_of(vmfb)
    needed = record.ptx_isa if record else None
    driver = local_driver()
    if needed and driver:
        check_ptx_loads(Version.parse(needed), driver, compiler="built", where=str(vmfb))


# The largest transient storage a model function may ask for (1 TiB): a larger size read from a
# module is damage, not a model.
MAX_TRANSIENTS_BYTES = 1 << 40


def transients_size(function: VmFunction, where: str) -> int | None:
    """The bytes of caller storage a function with `iree.abi.transients` needs, as IREE's
    reflection states it when it is a constant; None where it is not (dynamic shapes)."""
    text = function.reflection.get(TRANSIENTS_SIZE_KEY)
    if text is None:
        return None
    try:
        size = int(text)
    except ValueError:
        size = -1
    if not 0 <= size <= MAX_TRANSIENTS_BYTES:
        raise KitError(f"{where}: its transient storage size {text[:40]!r} is not a size in bytes", fix="rebuild the model: kitdispatch build --model MODEL -o DIR")
    return size


class Module:
    """A .vmfb loaded on a device. `module.NAME(...)` (or `module["NAME"]`) is a `Function`:
    host arrays in give host arrays out; device arrays in (this module's, IREE's, or CUDA
    tensors of torch, CuPy, ... through DLPack) give device arrays out. A model's module
    (`model`: its record, from `load_module` of a model build) has `ModelEntry` functions."""

    def __init__(self, vmfb: str | Path, *, device: str = "cuda", model: ModelRecord | None = None, parameters: str | Path | None = None):
        import iree.runtime as rt

        self.path = Path(vmfb)
        if not self.path.is_file():
            raise KitError(f"no module at {self.path}", fix="build it first: kitdispatch build ... -o DIR")
        record = read_record_of(self.path) if model is None else None
        require_cuda(device)
        preflight_run(self.path, record)
        self.model = model
        if model is not None:
            self.signatures = {f.name: model_signature(f) for f in model.functions}
        else:
            self.signatures = {f.name: f for f in record.functions} if record else {}
        self.device = get_device(device)
        self.hal_device = self.device.hal
        config = rt.Config(device=self.hal_device)
        self._context = rt.SystemContext(config=config)
        if parameters is not None:
            self._context.add_vm_module(parameter_module(Path(parameters), config))
        try:
            self._vm_module = rt.VmModule.mmap(config.vm_instance, str(self.path))
            self._context.add_vm_module(self._vm_module)
        except IREE_STATUS_ERRORS as exc:
            raise _load_error(self.path, device, exc) from None
        self._functions = self._context.modules[self._vm_module.name]
        self._bound: dict[str, Function] = {}
        self.name = self._vm_module.name

    @property
    def function_names(self) -> tuple[str, ...]:
        return tuple(self.signatures) if self.signatures else ()

    def raw(self, name: str) -> FunctionInvoker:
        """IREE's own callable: no argument checks, and it takes device arrays
        (`iree.runtime.asdevicearray(module.hal_device, x)`) as well as numpy."""
        try:
            return self._functions[name]
        except (KeyError, AttributeError):
            known = ", ".join(self.function_names) or "see `iree-dump-module`"
            raise KitError(f"{self.path} has no function {name!r}", fix=f"call one of: {known}") from None

    def function(self, name: str) -> "Function":
        bound = self._bound.get(name)
        if bound is None:
            invoker = self.raw(name)
            lookup = self._vm_module.lookup_function
            if self.model is not None:
                signature = self.signatures.get(name) or f"the model record lists no function {name!r}"
                vm_async, transients = self._model_async(name)
                bound = self._bound[name] = ModelEntry(self, name, signature, invoker, vm_async, transients=transients)
                return bound
            vm_calls = (lookup(name + ASYNC_SUFFIX), lookup(name + RECORDING_SUFFIX))
            bound = self._bound[name] = Function(self, name, self.signatures.get(name), invoker, *vm_calls)
        return bound

    def _model_async(self, name: str) -> tuple[VmFunction | None, int | None]:
        """A model function's asynchronous call and, where it takes caller storage for its
        transients (NAME$async_transients, models/transients.py), the storage's size in bytes.
        Only the kit's build has the twin (not the baseline), and only where IREE sized its
        storage as a constant: else NAME$async, as IREE exports it. Only on CUDA: there every
        queue operation of every call runs on one stream in issue order, so one storage serves
        all calls; on other devices calls overlap as far as their fences allow, and IREE may
        write the storage (a copy into it that waits on nothing) while the call before still
        reads it."""
        lookup = self._vm_module.lookup_function
        recorded = next((f for f in self.model.functions if f.name == name), None)
        if recorded is None or not recorded.transients or self.path.name != self.model.vmfb:
            return lookup(name + ASYNC_SUFFIX), None
        twin = lookup(name + TRANSIENTS_SUFFIX)
        if twin is None:  # the record and the module disagree, on any device
            raise KitError(
                f"{self.path} has no function {name}{TRANSIENTS_SUFFIX}, which its model record says it has",
                fix="rebuild the model: kitdispatch build --model MODEL -o DIR",
            )
        size = transients_size(twin, f"{self.path}: {name}{TRANSIENTS_SUFFIX}")
        return (twin, size) if size is not None and self.device.is_cuda else (lookup(name + ASYNC_SUFFIX), None)

    def __getitem__(self, name: str) -> "Function":
        return self.function(name)

    def __getattr__(self, name: str) -> "Function":
        if name.startswith("_"):
            raise AttributeError(name)
        return self.function(name)

    def call(self, name: str, *args: object, out: object | None = None) -> object:
        """Calls `name` and waits; one result, or a tuple for several."""
        return self.function(name)(*args, out=out)


PARAMETER_SCOPE = "model"  # where iree-import-onnx --externalize-params puts the weights (--params-scope)


def parameter_module(path: Path, config: object) -> object:
    """IREE's io_parameters module serving the weights of a parameter file (.irpa, .gguf,
    .safetensors) under PARAMETER_SCOPE, for a model imported with its weights externalized."""
    import iree.runtime as rt

    if not path.is_file():
        raise UsageError(f"no parameter file at {path}", fix="pass the .irpa (or .gguf, .safetensors) file the model's weights are in")
    index = rt.ParameterIndex()
    try:
        index.load(str(path))
    except IREE_STATUS_ERRORS as exc:
        raise UsageError(f"IREE cannot read the parameters in {path}: {str(exc).strip()[:300]}", fix="pass an .irpa, .gguf or .safetensors file") from None
    return rt.create_io_parameters_module(config.vm_instance, index.create_provider(scope=PARAMETER_SCOPE))


def _load_error(vmfb: Path, device: str, exc: Exception) -> KitError:
    """IREE's refusal to load a module, as one error: a module compiled for another device
    (every kit module holds CUDA kernels) is bad input, anything else a failed load."""
    text = str(exc).strip()
    if "'io_parameters' not registered" in text:
        return UsageError(
            f"{vmfb} reads its weights from a parameter file (it was imported with its weights externalized)",
            fix="load it with parameters=FILE.irpa (kd.load_module(DIR, parameters=...))",
        )
    if "INCOMPATIBLE" in text:
        target = re.search(r'#hal\.device\.target<"([^"]+)"', text)
        return UsageError(
            f"{vmfb} was compiled for IREE's {target.group(1) if target else 'another'} device and cannot run on {device!r}",
            fix="run it on the device it was built for: kitdispatch's modules run on --device cuda (or cuda://N)",
        )
    return KitError(f"IREE's runtime cannot load {vmfb} on {device!r}: {text[:500]}", fix="rebuild the module")


def load_module(path: str | Path, *, device: str = "cuda", baseline: bool = False, parameters: str | Path | None = None) -> Module:
    """A kernel module's .vmfb, or a model build (`build_model`'s folder, its record or its
    .vmfb): the model's module, or with `baseline=True` IREE's own build of the model;
    `parameters`: the file its weights are in, for a model imported with them externalized."""
    model = model_build(Path(path), baseline)
    if model is not None:
        return Module(model[0], device=device, model=model[1], parameters=parameters)
    if baseline:
        raise UsageError(f"{path} is not a model build folder, so it has no baseline", fix="pass the folder written by kitdispatch build --model MODEL -o DIR")
    return Module(path, device=device, parameters=parameters)
