"""On a CUDA GPU: calls that keep data on the device, DLPack round trips with torch and CuPy,
out=, and launching many calls then waiting once. Skipped where IREE's cuda driver finds no device."""

import numpy as np
import pytest

import kitdispatch as kd
from kitdispatch import KitError, load_module

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def module(simple_mul_build):
    return load_module(simple_mul_build / "simple_mul.vmfb")


def random(n, seed):
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32)


def test_device_arrays_in_give_device_arrays_out(module):
    lhs, rhs = random(1000, 1), random(1000, 2)
    dl, dr = module.device.put(lhs), module.device.put(rhs)
    out = module.simple_mul(dl, dr)
    assert isinstance(out, kd.DeviceArray) and out.shape == (1000,) and out.dtype == np.float32
    np.testing.assert_array_equal(out.to_host(), lhs * rhs)
    # A result goes straight into the next call. An inout result is its argument, updated in
    # place (host arrays are copied in, so they never change).
    again = module.simple_mul_inplace(out, dr)
    np.testing.assert_array_equal(again.to_host(), lhs * rhs * rhs)
    np.testing.assert_array_equal(dr.to_host(), lhs * rhs * rhs)
    module.simple_mul_inplace(lhs, rhs)
    np.testing.assert_array_equal(rhs, random(1000, 2))


def test_out_writes_into_the_given_array(module):
    lhs, rhs = random(4097, 3), random(4097, 4)
    dl, dr = module.device.put(lhs), module.device.put(rhs)
    target = module.device.empty((4097,), np.float32)
    assert module.simple_mul(dl, dr, out=target) is target
    np.testing.assert_array_equal(target.to_host(), lhs * rhs)
    with pytest.raises(KitError, match="n = 4096 here but 4097"):
        module.simple_mul(dl, dr, out=module.device.empty((4096,), np.float32))


def test_launch_many_then_wait_once(module):
    """A chain of 200 dependent launches returns before the GPU is done; one wait settles it."""
    x = np.full(1 << 20, 1.0001, np.float32)
    dx = module.device.put(x)
    acc = module.device.put(np.ones(1 << 20, np.float32))
    expected = np.ones(1 << 20, np.float32)
    for _ in range(200):
        acc = module.simple_mul.launch(acc, dx)  # each waits for the one before
        expected = expected * x
    module.device.synchronize()
    np.testing.assert_array_equal(acc.to_host(), expected)


def test_out_reused_by_launched_calls_keeps_order(module):
    a, b = random(1 << 16, 5), random(1 << 16, 6)
    da, db = module.device.put(a), module.device.put(b)
    out = module.device.empty(a.shape, np.float32)
    for _ in range(50):
        module.simple_mul.launch(da, db, out=out)
        module.simple_mul.launch(out, db, out=out)  # reads what the call before wrote
    np.testing.assert_array_equal(out.to_host(), a * b * b)  # to_host waits for all


def test_pool_reuses_output_buffers(module):
    x = module.device.put(random(1 << 12, 7))
    stats = module.device.pool.stats
    module.simple_mul(x, x)  # the first call of this size may allocate
    allocations = stats.allocations
    for _ in range(20):
        module.simple_mul(x, x)  # each result dies at once and returns its buffer
    assert stats.allocations == allocations and stats.reuses >= 20


def test_torch_round_trip_without_copies(module):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    x = torch.randn(3000, device="cuda")
    y = torch.randn(3000, device="cuda")
    out = torch.empty_like(x)
    assert module.simple_mul(x, y, out=out) is out  # the kernel writes torch's memory
    torch.testing.assert_close(out, x * y, rtol=0, atol=0)
    result = module.simple_mul(x * 2, y)  # torch's pending work is waited for at import
    assert isinstance(result, kd.DeviceArray)
    as_torch = torch.from_dlpack(result)
    torch.testing.assert_close(as_torch, x * 2 * y, rtol=0, atol=0)
    as_torch.fill_(7.0)  # one memory: what torch writes, the kit array holds
    torch.cuda.synchronize()
    np.testing.assert_array_equal(result.to_host(), np.full(3000, 7.0, np.float32))


def test_cupy_round_trip(module):
    cupy = pytest.importorskip("cupy")
    x = cupy.arange(100, dtype=cupy.float32)
    back = cupy.from_dlpack(module.simple_mul(x, x))
    cupy.testing.assert_array_equal(back, x * x)


def test_launched_results_wait_before_going_to_torch(module):
    torch = pytest.importorskip("torch")
    x = module.device.put(np.full(1 << 22, 1.5, np.float32))
    acc = x
    for _ in range(20):
        acc = module.simple_mul.launch(acc, x)
    as_torch = torch.from_dlpack(acc)  # __dlpack__ waits for every launched call
    assert float(as_torch[0]) == pytest.approx(1.5**21, rel=1e-5)


def test_prepared_inout_call_updates_its_argument_in_place(module):
    x = np.full(1 << 16, 1.01, np.float32)
    dx = module.device.put(x)
    acc = module.device.put(np.ones(1 << 16, np.float32))
    step = module.simple_mul_inplace.prepare(dx, acc)  # acc *= x, checked once
    for _ in range(100):
        result = step.launch()
    expected = np.ones(1 << 16, np.float32)
    for _ in range(100):
        expected = expected * x
    np.testing.assert_array_equal(result.to_host(), expected)
    np.testing.assert_array_equal(acc.to_host(), expected)  # the same memory


@pytest.mark.parametrize("how", ["prepared", "launch"])
def test_thousands_of_dependent_calls_run_in_launch_order(module, how):
    """Each call reads what the call before wrote (p -> q -> p ...), 2 x 3000 calls queued
    back to back: one call out of order would miss a factor. IREE 3.13's CUDA HAL reordered
    such submissions when they signalled the device's own semaphores (device.py)."""
    dev = module.device
    x = np.full(1 << 10, 1.0001, np.float32)
    dx = dev.put(x)
    p, q = dev.put(np.ones(1 << 10, np.float32)), dev.empty((1 << 10,), np.float32)
    mul = module.simple_mul
    if how == "prepared":
        steps = (mul.prepare(p, dx, out=q).launch, mul.prepare(q, dx, out=p).launch)
    else:
        steps = (lambda: mul.launch(p, dx, out=q), lambda: mul.launch(q, dx, out=p))
    expected = np.ones(1 << 10, np.float32)
    for _ in range(3000):
        for step in steps:
            step()
            expected = expected * x
    np.testing.assert_array_equal(p.to_host(), expected)


def test_prepared_calls_after_the_first_submit_a_recorded_command_buffer(module):
    dev = module.device
    a, b = random(5000, 8), random(5000, 9)
    da, db = dev.put(a), dev.put(b)
    step = module.simple_mul.prepare(da, db)
    first = step.launch()
    assert step._commands is not None  # recorded by the first launch (NAME$record)
    again = step.launch()
    assert again is first  # the same result array every time
    np.testing.assert_array_equal(again.to_host(), a * b)
