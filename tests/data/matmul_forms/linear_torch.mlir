// nn.Linear without bias, as torch-mlir writes it (torch.aten.linear, weight [out, in]): an f16
// layer on [4, 32, 256] activations and an f32 one at batch 1. IREE 3.13 makes the first a
// linalg.matmul reading W transposed (A collapsed to [128, 256]); the second a batch_matmul of
// batch 1 whose B is W expanded to [384, 1, 256] and transposed to [1, 256, 384] (the form
// HF models exported through iree-turbine take at batch 1).
module {
  func.func @linear_f16(%x: !torch.vtensor<[4,32,256],f16>, %w: !torch.vtensor<[384,256],f16>) -> !torch.vtensor<[4,32,384],f16> {
    %none = torch.constant.none
    %0 = torch.aten.linear %x, %w, %none : !torch.vtensor<[4,32,256],f16>, !torch.vtensor<[384,256],f16>, !torch.none -> !torch.vtensor<[4,32,384],f16>
    return %0 : !torch.vtensor<[4,32,384],f16>
  }
  func.func @linear_f32_batch1(%x: !torch.vtensor<[1,32,256],f32>, %w: !torch.vtensor<[384,256],f32>) -> !torch.vtensor<[1,32,384],f32> {
    %none = torch.constant.none
    %0 = torch.aten.linear %x, %w, %none : !torch.vtensor<[1,32,256],f32>, !torch.vtensor<[384,256],f32>, !torch.none -> !torch.vtensor<[1,32,384],f32>
    return %0 : !torch.vtensor<[1,32,384],f32>
  }
}
