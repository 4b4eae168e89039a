// One MLP layer with a softmax head: softmax(gelu(x @ w + b)), row by row.
// IREE generates the matmul (linalg on tensors); bias + GELU and the softmax are the custom
// kernels of mlp_kernels.cu, called through the functions kitdispatch generates for them.
func.func @mlp(%x: tensor<?x?xf32>, %w: tensor<?x?xf32>, %b: tensor<?xf32>) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %m = tensor.dim %x, %c0 : tensor<?x?xf32>
  %n = tensor.dim %w, %c1 : tensor<?x?xf32>
  %cst = arith.constant 0.0 : f32
  %init = tensor.empty(%m, %n) : tensor<?x?xf32>
  %zero = linalg.fill ins(%cst : f32) outs(%init : tensor<?x?xf32>) -> tensor<?x?xf32>
  %mm = linalg.matmul ins(%x, %w : tensor<?x?xf32>, tensor<?x?xf32>) outs(%zero : tensor<?x?xf32>) -> tensor<?x?xf32>
  %h = call @bias_gelu(%mm, %b) : (tensor<?x?xf32>, tensor<?xf32>) -> tensor<?x?xf32>
  %p = call @row_softmax(%h) : (tensor<?x?xf32>) -> tensor<?x?xf32>
  return %p : tensor<?x?xf32>
}
