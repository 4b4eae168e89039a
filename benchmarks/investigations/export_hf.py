"""Export HF models built from their configs (random weights, no downloads) to ONNX as users do,
on a machine with torch and transformers: python benchmarks/investigations/export_hf.py OUT_DIR.
Then, where iree-compile is: kitdispatch build --model OUT_DIR/bert.onnx --with-baseline -o DIR."""
import os, sys, torch, transformers
out = sys.argv[1]
torch.manual_seed(0)
print("torch", torch.__version__, "transformers", transformers.__version__)
class Hidden(torch.nn.Module):
    """What users export: the model called with keyword input_ids, its last hidden state out."""
    def __init__(self, model):
        super().__init__()
        self.model = model
    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


def export(name, model, args, names):
    model = Hidden(model.eval()).eval()
    path = os.path.join(out, f"{name}.onnx")
    torch.onnx.export(model, args, path, input_names=names, opset_version=17, dynamo=False)
    print(name, os.path.getsize(path), "bytes")
# BERT: real per-layer shapes of a small BERT (hidden 256, 4 heads, ffn 1024), 2 layers, batch 1 seq 128
cfg = transformers.BertConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024, vocab_size=1000)
ids = torch.randint(0, 1000, (1, 128))
export("bert", transformers.BertModel(cfg), (ids,), ["input_ids"])
# GPT-2 with 2 layers of hidden 256
g = transformers.GPT2Config(n_embd=256, n_layer=2, n_head=4, vocab_size=1000, n_positions=256)
export("gpt2", transformers.GPT2Model(g), (ids,), ["input_ids"])
