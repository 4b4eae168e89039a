"""torch CUDA tensors at launch cost: imported once per tensor (device.TorchImports), checked
on every call, dropped with the tensor, and every call ordered after torch's queued work.

The bookkeeping runs everywhere (on stand-in tensors: the cache reads only data_ptr, shape,
stride and dtype); the rest needs torch with CUDA and a GPU (skipped otherwise)."""

import gc
import sys
import time
import types
import weakref

import numpy as np
import pytest

from kitdispatch.run.device import TorchImports
from kitdispatch.run.prepared import TorchCalls


class Tensor:
    """What TorchImports reads of a torch tensor."""

    def __init__(self, ptr, shape=(4,), stride=(1,), dtype="float32"):
        self.ptr, self.shape, self._stride, self.dtype = ptr, shape, stride, dtype

    def data_ptr(self):
        return self.ptr

    def stride(self):
        return self._stride


def test_an_import_serves_its_tensor_while_it_is_unchanged():
    imports = TorchImports()
    t, array = Tensor(0x1000), object()
    imports.add(t, array)
    assert imports.get(t) is array and len(imports) == 1
    assert imports.get(Tensor(0x1000)) is None  # another tensor on the same memory: its own import
    for change in (("ptr", 0x2000), ("shape", (2, 2)), ("_stride", (2,)), ("dtype", "float16")):
        changed = Tensor(0x1000)
        imports.add(changed, array)
        setattr(changed, *change)  # set_, resize_, an in-place transpose, a view as another type
        assert imports.get(changed) is None, change


def test_imports_go_with_their_tensors_and_stay_bounded():
    imports = TorchImports()
    t = Tensor(0x1000)
    imports.add(t, "first")
    imports.add(t, "again")  # re-imported after a change: the first finalizer must not drop it
    del t
    gc.collect()
    assert len(imports) == 0
    kept = [Tensor(i) for i in range(TorchImports.LIMIT + 10)]
    for k in kept:
        imports.add(k, k.ptr)
    assert len(imports) == TorchImports.LIMIT and imports.get(kept[0]) is None and imports.get(kept[-1]) == kept[-1].ptr


def test_real_torch_tensors_take_their_imports_with_them():
    """With torch (its CPU build is enough) and IREE's local-task device: an import of the
    tensor itself would keep the tensor alive (torch preserves a tensor's Python object while
    its C++ tensor has other owners, as the DLPack import is), so its entry would never go;
    the import of a detached view, as the kit makes, goes with the tensor."""
    torch = pytest.importorskip("torch")
    from kitdispatch.run.device import DeviceArray, get_device

    dev = get_device("local-task")
    for detached in (False, True):
        imports, t = TorchImports(), torch.arange(8, dtype=torch.float32)
        view = dev.hal.from_dlpack_capsule((t.detach() if detached else t).__dlpack__())
        imports.add(t, DeviceArray(dev, view, (8,), np.dtype(np.float32)))
        del view, t
        gc.collect()
        assert len(imports) == (0 if detached else 1)


class _Prepared:
    """A PreparedCall holds the imports of the tensors, not the tensors."""

    def __init__(self):
        self.launches, self.holds_out = 0, True

    def forget_given(self):
        self.holds_out = False

    def queue(self):
        self.launches += 1


class _Function:
    """What TorchCalls uses of a Function: prepare."""

    def __init__(self):
        self.prepared = []

    def prepare(self, *args, out=None):
        self.prepared.append(_Prepared())
        return self.prepared[-1]


@pytest.fixture
def stand_in_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(Tensor=Tensor))


def test_launches_on_the_same_tensors_are_prepared_at_the_second_and_reused(stand_in_torch):
    function = _Function()
    calls = TorchCalls(function)
    x, y, out = Tensor(0x1000), Tensor(0x2000), Tensor(0x3000)
    assert not calls.launched((x, y, 2.0), out)  # seen once: the usual path
    assert calls.launched((x, y, 2.0), out) and calls.launched((x, y, 2.0), out)
    assert len(function.prepared) == 1 and function.prepared[0].launches == 2 and len(calls) == 1
    assert not function.prepared[0].holds_out  # the caller returns `out`: it is not held
    assert not calls.launched((x, y, 3.0), out)  # another scalar is another call
    assert not calls.launched((x, y, np.float32(2.0)), out)  # and another type
    assert not calls.launched((x, y, 2.0), (out, Tensor(0x4000)))  # other outputs too


def test_a_changed_tensor_is_prepared_again(stand_in_torch):
    function = _Function()
    calls = TorchCalls(function)
    x, y, out = Tensor(0x1000), Tensor(0x2000), Tensor(0x3000)
    calls.launched((x, y), out), calls.launched((x, y), out)
    for change in (("ptr", 0x5000), ("shape", (2, 2)), ("_stride", (2,)), ("dtype", "float16")):
        setattr(x, *change)  # set_, resize_, an in-place transpose, a view as another type
        assert not calls.launched((x, y), out), change  # the usual path re-imports and checks
        assert calls.launched((x, y), out)
    assert len(function.prepared) == 5 and len(calls) == 1


def test_calls_go_with_their_tensors_and_stay_bounded(stand_in_torch):
    function = _Function()
    calls = TorchCalls(function)
    x, y, out = Tensor(0x1000), Tensor(0x2000), Tensor(0x3000)
    calls.launched((x, y), out), calls.launched((x, y), out)
    assert len(calls) == 1
    prepared = weakref.ref(function.prepared.pop())
    del x
    gc.collect()
    assert len(calls) == 0 and not calls._entries and not calls._by_ids
    assert prepared() is None  # nothing holds the prepared call, nor so the imports it holds
    kept = [Tensor(i) for i in range(TorchCalls.LIMIT + 5)]
    for t in kept:
        calls.launched((t, y), out), calls.launched((t, y), out)
    assert len(calls) == TorchCalls.LIMIT


def test_a_scalar_computed_afresh_each_call_still_finds_its_prepared_call(stand_in_torch):
    function = _Function()
    calls = TorchCalls(function)
    x, out = Tensor(0x1000), Tensor(0x3000)
    results = [calls.launched((x, float("2.5")), out) for _ in range(4)]  # a new float object each call
    assert results == [False, True, True, True] and len(function.prepared) == 1


def test_a_shortcut_by_ids_is_not_taken_for_a_new_tensor_under_a_dead_ones_id(stand_in_torch):
    """The fast lookup keys a call by its values' ids: once a tensor dies, a new tensor that
    CPython places at the same address must not reach the dead tensor's prepared call."""
    function = _Function()
    calls = TorchCalls(function)
    y, out = Tensor(0x2000), Tensor(0x3000)
    x = Tensor(0x1000)
    old_id = id(x)
    calls.launched((x, y), out), calls.launched((x, y), out)
    assert calls._by_ids
    del x
    gc.collect()
    # The freed slot is usually the next one handed out; try a few allocations for it.
    kept = []
    while len(kept) < 1000 and (not kept or id(kept[-1]) != old_id):
        kept.append(Tensor(0x1000))
    if id(kept[-1]) != old_id:
        pytest.skip("CPython did not reuse the dead tensor's address")
    z = kept[-1]
    assert not calls.launched((z, y), out)  # seen once: the usual path, not the dead call
    assert function.prepared[0].launches == 1
    assert calls.launched((z, y), out) and len(function.prepared) == 2


def test_only_calls_on_torch_tensors_device_arrays_and_numbers(stand_in_torch):
    calls = TorchCalls(_Function())
    x, out = Tensor(0x1000), Tensor(0x3000)
    for other in (np.ones(4, np.float32), [1.0], "2"):  # host arrays are copied each call: no reuse
        calls.launched((x, other), out)
        assert not calls.launched((x, other), out)
    assert not calls.launched((1.0, 2.0), (1.0,)) and not calls.launched((1.0, 2.0), (1.0,))  # no tensor


# ---------------------------------------------------------------------- on a GPU


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


@pytest.fixture(scope="module")
def module(simple_mul_build):
    from kitdispatch import load_module

    return load_module(simple_mul_build / "simple_mul.vmfb")


@pytest.mark.gpu
def test_torch_tensors_are_imported_once(module, torch):
    dev = module.device
    x, y = torch.rand(1000, device="cuda"), torch.rand(1000, device="cuda")
    out = torch.empty_like(x)
    assert module.simple_mul(x, y, out=out) is out
    torch.testing.assert_close(out, x * y, rtol=0, atol=0)
    views = [dev.torch_imports.get(t) for t in (x, y, out)]
    assert all(v is not None for v in views)
    for _ in range(5):  # the second call records, later ones queue the recording
        module.simple_mul.launch(x, y, out=out)
    dev.synchronize()
    assert all(dev.torch_imports.get(t) is v for t, v in zip((x, y, out), views))
    # From the third call on the same tensors the call is a prepared one (TorchCalls).
    assert len(module.simple_mul._torch_calls) == 1
    assert dev.asarray(x) is views[0]
    torch.testing.assert_close(out, x * y, rtol=0, atol=0)


@pytest.mark.gpu
def test_a_changed_tensor_is_imported_again(module, torch):
    x, y = torch.rand(4096, device="cuda"), torch.rand(4096, device="cuda")
    out = torch.zeros_like(x)
    module.simple_mul(x, y, out=out)
    old = out.clone()
    before = torch.zeros_like(x)
    out.set_(before)  # the tensor now has other memory: the call must write that
    x.mul_(2)
    module.simple_mul(x, y, out=out)
    torch.cuda.synchronize()
    torch.testing.assert_close(before, x * y, rtol=0, atol=0)
    assert not torch.equal(old, before)


@pytest.mark.gpu
def test_imports_are_released_with_their_tensors(module, torch):
    dev = module.device
    small = [torch.rand(16, device="cuda") for _ in range(3)]
    module.simple_mul(*small[:2], out=small[2])
    torch.cuda.synchronize()
    gc.collect()
    base, count = torch.cuda.memory_allocated(), len(dev.torch_imports)
    big = [torch.rand(1 << 24, device="cuda") for _ in range(3)]  # 64 MiB each
    for _ in range(3):
        module.simple_mul.launch(*big[:2], out=big[2])
    dev.synchronize()
    assert len(dev.torch_imports) == count + 3
    del big
    module.simple_mul(*small[:2], out=small[2])  # IREE's list of returned values lets go of the last
    for _ in range(100):  # IREE releases a finished call's resources from its own thread
        gc.collect()
        torch.cuda.synchronize()
        if torch.cuda.memory_allocated() == base:
            break
        time.sleep(0.01)
    assert len(dev.torch_imports) == count and torch.cuda.memory_allocated() == base


@pytest.mark.gpu
@pytest.mark.parametrize("side_stream", [False, True])
def test_calls_run_after_torch_work_queued_before_them(module, torch, side_stream):
    """torch keeps the GPU busy (a 50 ms spin), then writes x; the kit's call must read the
    written x, on torch's default stream and on a stream of its own."""
    x, ones = torch.zeros(1 << 20, device="cuda"), torch.ones(1 << 20, device="cuda")
    out = torch.empty_like(x)
    module.simple_mul(x, ones, out=out)  # imported: later calls take the cached path
    step = module.simple_mul.prepare(x, ones, out=out)
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    for value, call in ((3.0, lambda: module.simple_mul(x, ones, out=out)), (5.0, step)):
        with torch.cuda.stream(stream):
            torch.cuda._sleep(100_000_000)
            x.fill_(value)
            call()
        np.testing.assert_array_equal(out.cpu().numpy(), np.full(1 << 20, value, np.float32))


@pytest.mark.gpu
def test_a_call_prepared_on_tensors_never_imported_before_waits_for_torch_too(module, torch):
    """prepare() on fresh torch tensors imports them itself; each later launch must still
    run after the torch work queued before it (a 50 ms spin, then a write of x)."""
    x, ones = torch.zeros(1 << 20, device="cuda"), torch.ones(1 << 20, device="cuda")
    out = torch.empty_like(x)
    step = module.simple_mul.prepare(x, ones, out=out)
    for value in (3.0, 5.0):
        torch.cuda._sleep(100_000_000)
        x.fill_(value)
        step()
        np.testing.assert_array_equal(out.cpu().numpy(), np.full(1 << 20, value, np.float32))


@pytest.mark.gpu
def test_repeated_launches_are_prepared_and_still_see_every_change(module, torch):
    """From the third launch on the same tensors the call is a prepared one (TorchCalls): it
    must still read what torch wrote since, and a tensor given other memory is checked anew."""
    f, dev = module.simple_mul, module.device
    x, y = torch.rand(4096, device="cuda"), torch.rand(4096, device="cuda")
    out = torch.zeros_like(x)
    for _ in range(3):
        assert f.launch(x, y, out=out) is out
    assert len(f._torch_calls) == 1
    x.mul_(2)  # queued on torch's stream just before the next launch
    f.launch(x, y, out=out)
    dev.synchronize()
    torch.testing.assert_close(out, x * y, rtol=0, atol=0)
    other = torch.zeros_like(x)
    out.set_(other)
    for _ in range(3):
        f.launch(x, y, out=out)
    dev.synchronize()
    torch.testing.assert_close(other, x * y, rtol=0, atol=0)
