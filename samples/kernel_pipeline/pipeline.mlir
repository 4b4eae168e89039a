// Column-wise softmax and argmax of x f32[rows, cols]: transpose so that every column becomes a
// row, then the row kernels. Three custom dispatches chained on device tensors, nothing copied
// back to the host in between.
func.func @column_softmax_argmax(%x: tensor<?x?xf32>) -> (tensor<?x?xf32>, tensor<?xi32>) {
  %t = call @transpose(%x) : (tensor<?x?xf32>) -> tensor<?x?xf32>
  %p = call @row_softmax(%t) : (tensor<?x?xf32>) -> tensor<?x?xf32>
  %i = call @row_argmax(%p) : (tensor<?x?xf32>) -> tensor<?xi32>
  return %p, %i : tensor<?x?xf32>, tensor<?xi32>
}
