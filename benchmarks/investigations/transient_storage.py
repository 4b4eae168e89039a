"""Do a model's calls overlap on the GPU when its transient memory is the caller's? IREE 3.13's
CUDA HAL blocks the calling thread in `queue_alloca` and `queue_dealloca` until their wait
fences are reached (runtime/src/iree/hal/drivers/cuda/cuda_device.c: "The CUDA HAL is not
currently asynchronous"). A model function frees its transients with a dealloca that waits on
its own execution, so every call returns only once the GPU has run it: calls never overlap, and
the host's time per call adds to the GPU's. A function whose transients live in storage the
caller passes (`iree.abi.transients` on a `!hal.buffer` argument) has no dealloca.

Two steps, as benchmarks/hf_models.py:

    python benchmarks/investigations/transient_storage.py build ONNX_DIR OUT_DIR [NAME ...]
    python benchmarks/investigations/transient_storage.py run OUT_DIR            # on the GPU machine

`build` imports each NAME.onnx with its weights as parameters and compiles it by IREE alone
twice: as it is (NAME.plain.vmfb) and with a transient-storage argument and indirect command
buffers (NAME.storage.vmfb). `run` calls NAME$async of each in loops of 30 launches with one
wait (the GPU may overlap calls) and waited one by one, and prints both per call."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hf_models import NAME_RE, describe_parameters, draw_parameters, import_onnx, model_inputs  # noqa: E402

FLAGS = ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_89", "--iree-opt-const-eval=false"]
STORAGE_FLAGS = ["--iree-hal-force-indirect-command-buffers=true"]
# IREE alone as it is and with caller storage; the kit's builds of both (NAME.kit[storage].vmfb,
# made with kd.build_model and BuildOptions(iree_flags=STORAGE_FLAGS) where there is storage).
VARIANTS = ("plain", "storage", "kit", "kitstorage")


def build(onnx_dir: Path, out: Path, names: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    compiler = Path(sys.executable).parent / "iree-compile"
    for onnx in sorted(onnx_dir.glob("*.onnx")):
        name = onnx.stem
        if not NAME_RE.match(name) or (names and name not in names):
            continue
        mlir, irpa = out / f"{name}.mlir", out / f"{name}.irpa"
        storage_mlir = out / f"{name}.storage.mlir"
        mine = [mlir, irpa, storage_mlir, out / f"{name}.params.npz", *(out / f"{name}.{v}.vmfb" for v in ("plain", "storage"))]
        taken = [str(path) for path in mine if path.exists() or path.is_symlink()]
        if taken:  # never overwrite or delete what this script did not write in this run
            print(f"{name}: skipped, {', '.join(taken)} already there (remove it or choose another OUT_DIR)", flush=True)
            continue
        import_onnx(onnx, mlir, irpa)
        describe_parameters(mlir, irpa, out / f"{name}.params.npz")
        irpa.unlink()
        text = mlir.read_text()
        with_storage, count = re.subn(r"(func\.func @main_graph\([^)]*)\)", r"\1, %storage: !hal.buffer {iree.abi.transients})", text, count=1)
        if count != 1:
            raise SystemExit(f"{name}: no func.func @main_graph to add the storage argument to")
        storage_mlir.write_text(with_storage)
        subprocess.run([str(compiler), str(mlir), *FLAGS, "-o", str(out / f"{name}.plain.vmfb")], check=True, timeout=900)
        subprocess.run([str(compiler), str(storage_mlir), *FLAGS, *STORAGE_FLAGS, "-o", str(out / f"{name}.storage.vmfb")],
                       check=True, timeout=900)
        mlir.unlink()
        storage_mlir.unlink()
        print(f"built {name}", flush=True)


def run(out: Path) -> None:
    import iree.runtime as rt

    config = rt.Config("cuda")
    device = config.device
    for spec in sorted(out.glob("*.params.npz")):
        name = spec.name[: -len(".params.npz")]
        m = NAME_RE.match(name)
        with tempfile.TemporaryDirectory() as tmp:
            irpa = Path(tmp) / "w.irpa"
            draw_parameters(spec, irpa)
            index = rt.ParameterIndex()
            index.load(str(irpa))
            inputs = [rt.asdevicearray(device, a) for a in model_inputs(m["model"], int(m["batch"]), int(m["seq"]), m["dtype"])]
            for variant in VARIANTS:
                if not (out / f"{name}.{variant}.vmfb").is_file():
                    continue
                params = rt.create_io_parameters_module(config.vm_instance, index.create_provider(scope="model"))
                module = rt.VmModule.mmap(config.vm_instance, str(out / f"{name}.{variant}.vmfb"))
                context = rt.VmContext(config.vm_instance, modules=[rt.create_hal_module(config.vm_instance, device), params, module])
                function = module.lookup_function("main_graph$async")
                storage = None
                if variant.endswith("storage"):
                    size = int(function.reflection.get("iree.abi.transients.size.constant", 0) or 64 << 20)
                    storage = device.allocator.allocate_buffer(memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT,
                                                               allocation_size=max(size, 1))
                semaphore = device.create_semaphore(0)
                count = [0]

                def launch() -> rt.HalFence:
                    args = rt.VmVariantList(4)
                    for a in inputs:
                        args.push_ref(a._buffer_view)
                    if storage is not None:
                        args.push_ref(storage)
                    done = rt.HalFence.create_at(semaphore, count[0] + 1)
                    args.push_ref(rt.HalFence(0).ref)
                    args.push_ref(done.ref)
                    results = rt.VmVariantList(1)
                    context.invoke(function, args, results)
                    count[0] += 1
                    return done

                def pipelined(n: int = 30) -> float:
                    start = time.perf_counter()
                    for _ in range(n):
                        done = launch()
                    done.wait()
                    return (time.perf_counter() - start) / n * 1e6

                def one_by_one(n: int = 30) -> float:
                    start = time.perf_counter()
                    for _ in range(n):
                        launch().wait()
                    return (time.perf_counter() - start) / n * 1e6

                for _ in range(5):
                    launch().wait()
                piped = statistics.median(pipelined() for _ in range(7))
                waited = statistics.median(one_by_one() for _ in range(7))
                print(f"{name} {variant:8s}: loops of 30, one wait {piped:7.1f} us a call; waited each {waited:7.1f} us", flush=True)


def main() -> None:
    step = sys.argv[1]
    if step == "build":
        build(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:])
    else:
        run(Path(sys.argv[2]))


if __name__ == "__main__":
    main()
