// The ABI kitdispatch generates for kernel functions (render.py), computed by IREE's CPU
// codegen so the runtime's call paths run on machines without a GPU: NAME (IREE's
// synchronous call, allocating) and NAME$async (coarse fences, results into given outputs).
// `twice` has no $async form, like a [[programs]] function.

func.func @add(%x: tensor<?xf32>, %y: tensor<?xf32>) -> tensor<?xf32> {
  %r = arith.addf %x, %y : tensor<?xf32>
  return %r : tensor<?xf32>
}
util.func public @add$async(%x: tensor<?xf32>, %y: tensor<?xf32>, %out: tensor<?xf32> {iree.abi.output = 0 : index}) -> tensor<?xf32> attributes {iree.abi.model = "coarse-fences"} {
  %r = arith.addf %x, %y : tensor<?xf32>
  util.return %r : tensor<?xf32>
}

func.func @scale(%x: tensor<?xf32>, %alpha: f32) -> tensor<?xf32> {
  %r = call @scale_impl(%x, %alpha) : (tensor<?xf32>, f32) -> tensor<?xf32>
  return %r : tensor<?xf32>
}
util.func public @scale$async(%x: tensor<?xf32>, %alpha: f32, %out: tensor<?xf32> {iree.abi.output = 0 : index}) -> tensor<?xf32> attributes {iree.abi.model = "coarse-fences"} {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?xf32>
  %e = tensor.empty(%n) : tensor<?xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>], iterator_types = ["parallel"]}
      ins(%x : tensor<?xf32>) outs(%e : tensor<?xf32>) {
  ^bb0(%v: f32, %o: f32):
    %m = arith.mulf %v, %alpha : f32
    linalg.yield %m : f32
  } -> tensor<?xf32>
  util.return %r : tensor<?xf32>
}
func.func private @scale_impl(%x: tensor<?xf32>, %alpha: f32) -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?xf32>
  %e = tensor.empty(%n) : tensor<?xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>], iterator_types = ["parallel"]}
      ins(%x : tensor<?xf32>) outs(%e : tensor<?xf32>) {
  ^bb0(%v: f32, %o: f32):
    %m = arith.mulf %v, %alpha : f32
    linalg.yield %m : f32
  } -> tensor<?xf32>
  return %r : tensor<?xf32>
}

func.func @sum_diff(%x: tensor<?x4xi32>, %y: tensor<?x4xi32>) -> (tensor<?x4xi32>, tensor<?x4xi32>) {
  %s = arith.addi %x, %y : tensor<?x4xi32>
  %d = arith.subi %x, %y : tensor<?x4xi32>
  return %s, %d : tensor<?x4xi32>, tensor<?x4xi32>
}
util.func public @sum_diff$async(%x: tensor<?x4xi32>, %y: tensor<?x4xi32>, %s_out: tensor<?x4xi32> {iree.abi.output = 0 : index}, %d_out: tensor<?x4xi32> {iree.abi.output = 1 : index}) -> (tensor<?x4xi32>, tensor<?x4xi32>) attributes {iree.abi.model = "coarse-fences"} {
  %s = arith.addi %x, %y : tensor<?x4xi32>
  %d = arith.subi %x, %y : tensor<?x4xi32>
  util.return %s, %d : tensor<?x4xi32>, tensor<?x4xi32>
}

func.func @twice(%x: tensor<?xf32>) -> tensor<?xf32> {
  %r = arith.addf %x, %x : tensor<?xf32>
  return %r : tensor<?xf32>
}

// A result without output storage, as an inout result is (there it is the argument's buffer,
// updated in place; IREE's CPU codegen allocates this one): the runtime takes it from the
// values the call returns.
func.func @negate(%x: tensor<?xf32>) -> tensor<?xf32> {
  %r = arith.negf %x : tensor<?xf32>
  return %r : tensor<?xf32>
}
util.func public @negate$async(%x: tensor<?xf32>) -> tensor<?xf32> attributes {iree.abi.model = "coarse-fences"} {
  %r = arith.negf %x : tensor<?xf32>
  util.return %r : tensor<?xf32>
}

// `copy` has a NAME$record form, as kernel functions do (render.py): a command buffer recorded
// once on the given buffer views that the runtime queues again. Here it records a copy, the
// one transfer a CPU device runs without an executable.
func.func @copy(%x: tensor<?xf32>) -> tensor<?xf32> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?xf32>
  %e = tensor.empty(%n) : tensor<?xf32>
  %r = linalg.copy ins(%x : tensor<?xf32>) outs(%e : tensor<?xf32>) -> tensor<?xf32>
  return %r : tensor<?xf32>
}
util.func public @copy$async(%x: tensor<?xf32>, %out: tensor<?xf32> {iree.abi.output = 0 : index}) -> tensor<?xf32> attributes {iree.abi.model = "coarse-fences"} {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?xf32>
  %e = tensor.empty(%n) : tensor<?xf32>
  %r = linalg.copy ins(%x : tensor<?xf32>) outs(%e : tensor<?xf32>) -> tensor<?xf32>
  util.return %r : tensor<?xf32>
}
util.func public @copy$record(%x: !hal.buffer_view, %out: !hal.buffer_view) -> !hal.command_buffer {
  %c0 = arith.constant 0 : index
  %any_queue = arith.constant -1 : i64
  %device = hal.device.resolve on(#hal.device.affinity<@__device_0>) : !hal.device
  %source = hal.buffer_view.buffer<%x : !hal.buffer_view> : !hal.buffer
  %target = hal.buffer_view.buffer<%out : !hal.buffer_view> : !hal.buffer
  %length = hal.buffer.length<%source : !hal.buffer> : index
  %commands = hal.command_buffer.create device(%device : !hal.device) mode("None") categories("Transfer|Dispatch") affinity(%any_queue) bindings(%c0) : !hal.command_buffer
  hal.command_buffer.copy_buffer<%commands : !hal.command_buffer> source(%source : !hal.buffer)[%c0] target(%target : !hal.buffer)[%c0] length(%length) flags("None")
  hal.command_buffer.execution_barrier<%commands : !hal.command_buffer> source("Dispatch|Transfer|CommandRetire") target("CommandIssue|Dispatch|Transfer") flags("None")
  hal.command_buffer.finalize<%commands : !hal.command_buffer>
  util.return %commands : !hal.command_buffer
}
