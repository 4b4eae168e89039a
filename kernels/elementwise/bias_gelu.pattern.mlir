// What `bias_gelu` computes, as the one linalg.generic a model's op must match to be replaced
// by it (kitdispatch build --model; replace_when.pattern in kitdispatch.toml):
//   out[r, c] = 0.5 * y * (1 + tanh(sqrt(2 / pi) * (y + 0.044715 * y^3))),  y = x[r, c] + bias[c]
// in the form IREE gives it once its elementwise fusion has joined a bias Add and a tanh GELU
// (ONNX's decomposed GELU, as exporters before opset 20 write it). The match is structural:
// the same iterator types, indexing maps, body ops in this order, operands and constants
// (bit for bit). Tensor sizes do not matter here; the kernel's params say which it takes.
func.func @bias_gelu(%x: tensor<?x?xf32>, %bias: tensor<?xf32>, %init: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %three = arith.constant 3 : i64
  %k = arith.constant 4.471500e-02 : f32
  %sqrt_2_over_pi = arith.constant 0.797884583 : f32
  %one = arith.constant 1.000000e+00 : f32
  %half = arith.constant 5.000000e-01 : f32
  %out = linalg.generic {
      indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>, affine_map<(d0, d1) -> (d0, d1)>],
      iterator_types = ["parallel", "parallel"]}
      ins(%x, %bias : tensor<?x?xf32>, tensor<?xf32>) outs(%init : tensor<?x?xf32>) {
  ^bb0(%in: f32, %b: f32, %unused: f32):
    %y = arith.addf %in, %b : f32
    %y3 = math.fpowi %y, %three : f32, i64
    %t0 = arith.mulf %y3, %k : f32
    %t1 = arith.addf %y, %t0 : f32
    %t2 = arith.mulf %t1, %sqrt_2_over_pi : f32
    %t3 = math.tanh %t2 : f32
    %t4 = arith.addf %t3, %one : f32
    %t5 = arith.mulf %t4, %half : f32
    %g = arith.mulf %y, %t5 : f32
    linalg.yield %g : f32
  } -> tensor<?x?xf32>
  return %out : tensor<?x?xf32>
}
