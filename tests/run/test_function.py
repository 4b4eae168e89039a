"""The runtime's call paths on the CPU: argument checks, out=, the output pool, launch order,
the fallback for functions without NAME$async, and `kitdispatch run` in process.

The module (tests/data/cpu_calls) has the ABI kitdispatch generates for kernel functions,
computed by IREE's CPU codegen and run on IREE's local-task device, so every path here runs
the real iree-compile and iree.runtime, with no GPU."""

import io

import numpy as np
import pytest

import kitdispatch as kd
from kitdispatch import KitError
from kitdispatch.cli import main
from kitdispatch.run.device import OutputPool
from kitdispatch.describe.types import ScalarType, TensorType
from kitdispatch.run.text_forms import format_result, parse_input

from conftest import CPU_DEVICE as DEVICE, DATA, cpu_module_vmfb, needs_iree_compile


@pytest.fixture(scope="module")
def vmfb(tmp_path_factory):
    return cpu_module_vmfb(DATA / "cpu_calls", "calls", tmp_path_factory.mktemp("cpu_calls"))


@pytest.fixture(scope="module")
def module(vmfb):
    return kd.load_module(vmfb, device=DEVICE)


def arange(n, dtype=np.float32):
    return np.arange(n, dtype=dtype)


# ------------------------------------------------------------------------ results


@needs_iree_compile
def test_host_in_host_out_and_device_in_device_out(module):
    x, y = arange(10), np.ones(10, np.float32)
    got = module.add(x, y)
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, x + y)
    dx = module.device.put(x)
    on_device = module.add(dx, y)  # one device argument keeps the result on the device
    assert isinstance(on_device, kd.DeviceArray) and on_device.shape == (10,)
    np.testing.assert_array_equal(np.asarray(on_device), x + y)
    np.testing.assert_array_equal(module.scale(dx, 2.5).to_host(), x * 2.5)


@needs_iree_compile
def test_several_results_and_out(module):
    a = arange(12, np.int32).reshape(3, 4)
    b = np.full((3, 4), 5, np.int32)
    s, d = module.sum_diff(a, b)
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(d, a - b)
    outs = (module.device.empty((3, 4), np.int32), module.device.empty((3, 4), np.int32))
    assert module.sum_diff(a, b, out=outs) == outs
    np.testing.assert_array_equal(outs[1].to_host(), a - b)


@needs_iree_compile
def test_results_without_storage_come_from_the_call(module):
    """`negate$async` has no output argument (as an inout result has none): its result is the
    buffer the call returns, and out= has nothing to fill."""
    x = arange(6)
    dx = module.device.put(x)
    np.testing.assert_array_equal(module.negate(dx).to_host(), -x)
    np.testing.assert_array_equal(module.negate(x), -x)
    with pytest.raises(KitError, match="writes 0 result"):
        module.negate(dx, out=module.device.empty((6,), np.float32))


@needs_iree_compile
def test_launched_calls_run_in_order(module):
    """Each launch reads what the one before wrote: the device's calls form one stream."""
    dev = module.device
    one = dev.put(np.ones(64, np.float32))
    acc = dev.put(np.zeros(64, np.float32))
    for _ in range(100):
        acc = module.add.launch(acc, one)
    out = dev.empty((64,), np.float32)
    for _ in range(50):
        module.add.launch(acc, one, out=out)
        module.add.launch(out, one, out=out)  # in place through out=
    np.testing.assert_array_equal(out.to_host(), np.full(64, 102, np.float32))
    np.testing.assert_array_equal(acc.to_host(), np.full(64, 100, np.float32))


@needs_iree_compile
def test_prepared_calls_run_again_into_the_same_arrays(module):
    dev = module.device
    acc = dev.put(np.zeros(16, np.float32))
    one = dev.put(np.ones(16, np.float32))
    step = module.add.prepare(acc, one, out=acc)  # acc += 1, checked once
    for _ in range(30):
        assert step.launch() is acc
    np.testing.assert_array_equal(acc.to_host(), np.full(16, 30, np.float32))
    neg = module.negate.prepare(one)  # a result IREE returns, read after each call
    for _ in range(3):
        np.testing.assert_array_equal(neg().to_host(), -np.ones(16, np.float32))
    pooled = module.sum_diff.prepare(arange(8, np.int32).reshape(2, 4), np.ones((2, 4), np.int32))
    s, d = pooled()
    np.testing.assert_array_equal(d.to_host(), arange(8, np.int32).reshape(2, 4) - 1)
    with pytest.raises(KitError, match="no NAME\\$async form"):
        module.twice.prepare(one)


@needs_iree_compile
def test_functions_without_async_form_run_synchronously(module):
    """`twice` has no twice$async (like a [[programs]] function): launch and call still work,
    in order with launched calls; out= is refused with the reason."""
    dev = module.device
    acc = dev.put(np.ones(8, np.float32))
    for _ in range(5):
        acc = module.add.launch(acc, acc)
    doubled = module.twice.launch(acc)
    assert isinstance(doubled, kd.DeviceArray)
    np.testing.assert_array_equal(doubled.to_host(), np.full(8, 64, np.float32))
    assert not module.twice.writes_into_outputs and module.add.writes_into_outputs
    with pytest.raises(KitError, match="cannot write into given outputs"):
        module.twice(acc, out=dev.empty((8,), np.float32))


# ------------------------------------------------------------------ argument checks


@needs_iree_compile
@pytest.mark.parametrize("device_args", [False, True])
def test_arguments_are_checked_before_iree(module, device_args):
    put = module.device.put if device_args else (lambda a: a)
    x = put(arange(4))
    cases = [
        ((x,), "add takes 2 arguments"),
        ((x, put(np.ones(4))), "got dtype float64"),
        ((x, put(arange(5))), "n = 5 here but 4"),
        ((x, put(arange(4).reshape(2, 2))), "got shape"),
    ]
    for args, message in cases:
        with pytest.raises(KitError, match=message):
            module.add(*args)
        with pytest.raises(KitError, match=message):
            module.add.launch(*args)
    with pytest.raises(KitError, match="out of range|not an integer|fits f32|could not convert"):
        module.scale(x, "two")


@needs_iree_compile
def test_out_is_checked(module):
    x = module.device.put(arange(4))
    dev = module.device
    with pytest.raises(KitError, match="writes 1 result"):
        module.add(x, x, out=(dev.empty((4,), np.float32), dev.empty((4,), np.float32)))
    with pytest.raises(KitError, match="n = 5 here but 4"):
        module.add(x, x, out=dev.empty((5,), np.float32))
    with pytest.raises(KitError, match="got dtype int32"):
        module.add(x, x, out=dev.empty((4,), np.int32))
    with pytest.raises(KitError, match="out= takes device arrays"):
        module.add(x, x, out=np.empty(4, np.float32))
    # Results never share an array: one given twice, or one IREE buffer view in two wrappers.
    a = module.device.put(arange(8, np.int32).reshape(2, 4))
    same = dev.empty((2, 4), np.int32)
    for outs in ((same, same), (same, kd.DeviceArray(dev, same.buffer_view, (2, 4), np.dtype(np.int32)))):
        with pytest.raises(KitError, match="results 0 and 1 are given one array; each result needs an array of its own"):
            module.sum_diff(a, a, out=outs)
        with pytest.raises(KitError, match="results 0 and 1 are given one array"):
            module.sum_diff.prepare(a, a, out=outs)
    # A refused call leaves the device usable: later calls still run and finish.
    np.testing.assert_array_equal(module.add(x, x).to_host(), arange(4) * 2)


@needs_iree_compile
def test_arrays_of_another_device_are_refused(module, vmfb):
    other = kd.load_module(vmfb, device="local-sync")
    foreign = other.device.put(arange(4))
    with pytest.raises(KitError, match="is on local-sync"):
        module.add(foreign, foreign)


# ------------------------------------------------------------------------ the pool


def test_pool_reuses_by_key_and_bounds_what_it_keeps():
    made = []
    pool = OutputPool(lambda key, n: made.append(key) or object(), max_free_bytes=100)
    a = pool.take("f32[10]", 40)
    b = pool.take("f32[10]", 40)
    pool.give("f32[10]", 40, a)
    assert pool.take("f32[10]", 40) is a  # same key: reused
    assert pool.stats.allocations == 2 and pool.stats.reuses == 1
    pool.give("f32[10]", 40, a)
    pool.give("f32[10]", 40, b)
    pool.give("f32[16]", 64, pool.take("f32[16]", 64))  # over max_free_bytes (80 + 64 > 100): not kept
    assert pool.stats.free_bytes == 80 and pool.stats.dropped == 1
    assert pool.take("i32[10]", 40) not in (a, b)  # another key never shares a buffer
    assert made == ["f32[10]", "f32[10]", "f32[16]", "i32[10]"]
    assert pool.trim() == 80 and pool.stats.free_bytes == 0


@needs_iree_compile
def test_results_give_their_buffers_back(module):
    dev = module.device
    x = dev.put(arange(1000))
    module.add(x, x)
    before = dev.pool.stats.allocations
    for _ in range(10):
        module.add.launch(x, x)  # each result dies at once
    dev.synchronize()
    assert dev.pool.stats.allocations == before
    kept = [module.add.launch(x, x) for _ in range(3)]  # live results hold their buffers
    assert dev.pool.stats.allocations == before + 2
    del kept


# ----------------------------------------------------------------- `kitdispatch run`


def test_inputs_parse_as_iree_run_module_reads_them(tmp_path):
    f32 = TensorType("f32", ("n",))
    np.testing.assert_array_equal(parse_input("4xf32=1 2 3 4", f32, "x"), arange(4) + 1)
    np.testing.assert_array_equal(parse_input("3xf32=2", f32, "x"), np.full(3, 2, np.float32))
    grid = parse_input("2x2xi32=[1 2][3 4]", TensorType("i32", (2, 2)), "x")
    assert grid.dtype == np.int32 and grid.tolist() == [[1, 2], [3, 4]]
    np.save(tmp_path / "a.npy", arange(3))
    np.testing.assert_array_equal(parse_input(f"@{tmp_path / 'a.npy'}", f32, "x"), arange(3))
    assert parse_input("2.5", ScalarType("f32"), "s") == 2.5 and parse_input("7", ScalarType("i32"), "s") == 7
    for text, message in (("4xi32=1", "the input is i32"), ("3xf32=1 2", "2 values for shape"), ("oops", "not an input")):
        with pytest.raises(KitError, match=message):
            parse_input(text, f32, "x")


def test_results_print_as_iree_run_module_prints_them():
    assert format_result(0, np.array([1.1, 100002, 3.25], np.float32)) == "result[0]: hal.buffer_view\n3xf32=1.1 100002 3.25"
    assert format_result(1, np.arange(8, dtype=np.int32).reshape(2, 4)).endswith("2x4xi32=[0 1 2 3][4 5 6 7]")


@needs_iree_compile
def test_cli_run_in_process_and_benchmark(vmfb):
    out, err = io.StringIO(), io.StringIO()
    args = ["run", str(vmfb), "--function", "add", "--input", "4xf32=1 2 3 4", "--input", "4xf32=0.5", "--device", DEVICE]
    assert main(args, out, err) == 0, err.getvalue()
    assert "4xf32=1.5 2.5 3.5 4.5" in out.getvalue()
    out = io.StringIO()
    assert main([*args, "--benchmark", "20"], out, err) == 0, err.getvalue()
    text = out.getvalue()
    assert "add: 20 calls" in text and "launched, one wait" in text and "synchronous" in text
    assert main(["run", str(vmfb), "--function", "add", "--input", "4xf32=1", "--device", DEVICE], io.StringIO(), err) == 1
    assert "takes 2 arguments" in err.getvalue()


def test_recorded_calls_record_the_second_call_and_forget_dead_arrays():
    """The bookkeeping of `launch(..., out=)` repeated on the same arrays (RecordedCalls):
    nothing recorded for a first call, one recording for the second, reuse after that, and
    the entry (which holds the arrays' memory) dropped when one of its arrays is collected."""
    import gc

    from kitdispatch.run.prepared import RecordedCalls

    class Array:  # what matters here: a weak-referenceable array with its own ref
        def __init__(self):
            self._ref = object()

    recordings = []
    calls = RecordedCalls(lambda refs: recordings.append(list(refs)) or f"commands {len(recordings)}")
    x, out = Array(), Array()
    refs = [x._ref, ("push_float", 2.0), out._ref]
    assert calls.commands_for(refs, [x, out]) is None and recordings == []
    assert calls.commands_for(refs, [x, out]) == "commands 1"
    assert calls.commands_for(refs, [x, out]) == "commands 1" and len(recordings) == 1 and len(calls) == 1
    other = [x._ref, ("push_float", 3.0), out._ref]  # another scalar: another call
    assert calls.commands_for(other, [x, out]) is None
    del x, refs, other
    gc.collect()
    assert len(calls) == 0  # x is gone, and with it the recording that held its memory
    for _ in range(RecordedCalls.LIMIT + 5):
        a = Array()
        calls.commands_for([a._ref, out._ref], [a, out])
    assert len(calls._entries) <= RecordedCalls.LIMIT


@needs_iree_compile
def test_repeated_calls_queue_their_recorded_command_buffer(module):
    """NAME$record on a real IREE device: a prepared call records on its first launch and
    queues the command buffer after that; `launch(..., out=)` on the same arrays does from
    its second call. The recorded call runs again each time, in order with other calls."""
    dev = module.device
    one = dev.put(np.ones(32, np.float32))
    x = dev.put(arange(32))
    copied = dev.empty((32,), np.float32)
    step = module.copy.prepare(x, out=copied)
    assert step.launch() is copied and step._commands is not None
    module.add.launch(x, one, out=x)  # x += 1, after the copy before and before the next
    step.launch()
    np.testing.assert_array_equal(copied.to_host(), arange(32) + 1)
    again = dev.empty((32,), np.float32)
    for k in range(5):
        assert module.copy.launch(x, out=again) is again
        module.add.launch(x, one, out=x)
    assert len(module.copy._recorded) == 1
    np.testing.assert_array_equal(again.to_host(), arange(32) + 5)
    np.testing.assert_array_equal(x.to_host(), arange(32) + 6)
