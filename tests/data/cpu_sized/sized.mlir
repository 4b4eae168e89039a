// Results sized by scalar arguments, with the ABI kitdispatch generates for kernel functions
// (render.py: the scalar cast to the result's dimension), computed by IREE's CPU codegen so
// the runtime's sizing runs without a GPU: `iota` (out = "i64[n]", n an i32 argument) and
// `rows` (x "f32[n]", count a u32 argument, out = "f32[count,n]": out[r, i] = x[i] + r).

func.func @iota(%n: i32) -> tensor<?xi64> {
  %r = call @iota_impl(%n) : (i32) -> tensor<?xi64>
  return %r : tensor<?xi64>
}
util.func public @iota$async(%n: i32, %out: tensor<?xi64> {iree.abi.output = 0 : index}) -> tensor<?xi64> attributes {iree.abi.model = "coarse-fences"} {
  %r = func.call @iota_impl(%n) : (i32) -> tensor<?xi64>
  util.return %r : tensor<?xi64>
}
func.func private @iota_impl(%n: i32) -> tensor<?xi64> {
  %dim_n = arith.index_cast %n : i32 to index
  %e = tensor.empty(%dim_n) : tensor<?xi64>
  %r = linalg.generic {indexing_maps = [affine_map<(i) -> (i)>], iterator_types = ["parallel"]}
      outs(%e : tensor<?xi64>) {
  ^bb0(%o: i64):
    %i = linalg.index 0 : index
    %v = arith.index_cast %i : index to i64
    linalg.yield %v : i64
  } -> tensor<?xi64>
  return %r : tensor<?xi64>
}

func.func @rows(%x: tensor<?xf32>, %count: i32) -> tensor<?x?xf32> {
  %r = call @rows_impl(%x, %count) : (tensor<?xf32>, i32) -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
util.func public @rows$async(%x: tensor<?xf32>, %count: i32, %out: tensor<?x?xf32> {iree.abi.output = 0 : index}) -> tensor<?x?xf32> attributes {iree.abi.model = "coarse-fences"} {
  %r = func.call @rows_impl(%x, %count) : (tensor<?xf32>, i32) -> tensor<?x?xf32>
  util.return %r : tensor<?x?xf32>
}
func.func private @rows_impl(%x: tensor<?xf32>, %count: i32) -> tensor<?x?xf32> {
  %c0 = arith.constant 0 : index
  %dim_n = tensor.dim %x, %c0 : tensor<?xf32>
  %dim_count = arith.index_castui %count : i32 to index
  %e = tensor.empty(%dim_count, %dim_n) : tensor<?x?xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(r, i) -> (i)>, affine_map<(r, i) -> (r, i)>], iterator_types = ["parallel", "parallel"]}
      ins(%x : tensor<?xf32>) outs(%e : tensor<?x?xf32>) {
  ^bb0(%v: f32, %o: f32):
    %r_i = linalg.index 0 : index
    %r_i64 = arith.index_cast %r_i : index to i64
    %r_f = arith.sitofp %r_i64 : i64 to f32
    %s = arith.addf %v, %r_f : f32
    linalg.yield %s : f32
  } -> tensor<?x?xf32>
  return %r : tensor<?x?xf32>
}
