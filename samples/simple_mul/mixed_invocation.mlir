// Custom kernels mixed with IREE-generated code, as in IREE's custom-dispatch sample:
// (lhs * rhs + rhs) * (lhs * rhs). With 8xf32=2 and 8xf32=4 every element is 96.
func.func @mixed_invocation(%lhs: tensor<?xf32>, %rhs: tensor<?xf32>) -> tensor<?xf32> {
  // The custom kernel, through the function kitdispatch generates for it.
  %product = call @simple_mul(%lhs, %rhs) : (tensor<?xf32>, tensor<?xf32>) -> tensor<?xf32>
  // Code that IREE generates itself, interleaved with the custom dispatches.
  %sum = arith.addf %product, %rhs : tensor<?xf32>
  // The in-place kernel: its result is `sum *= product`.
  %result = call @simple_mul_inplace(%product, %sum) : (tensor<?xf32>, tensor<?xf32>) -> tensor<?xf32>
  return %result : tensor<?xf32>
}
