"""The shapes benchmarks/gemm.py times (and benchmarks/gemm_iree.py builds IREE's codegen for).
Pure Python: the build machine imports it without torch or CuPy."""


def model_shapes():
    """(label, m, n, k): every linear of the models, M = tokens."""
    lin = [
        ("bert/vit/gpt2 qkv-or-proj 768->768", 768, 768),
        ("gpt2 qkv 768->2304", 2304, 768),
        ("bert/vit/gpt2 ffn1 768->3072", 3072, 768),
        ("bert/vit/gpt2 ffn2 3072->768", 768, 3072),
        ("llama attn 4096->4096", 4096, 4096),
        ("llama mlp gate/up 4096->11008", 11008, 4096),
        ("llama mlp down 11008->4096", 4096, 11008),
    ]
    return [(label, m, n, k) for m in (128, 512, 2048, 8192) for label, n, k in lin]


def square_shapes():
    """(dtype, size, layout) of the large squares."""
    return [(ti, s, layout) for ti in ("f16", "bf16") for s in (2048, 4096, 8192) for layout in ("nn", "nt")]


def attention_shapes():
    """(label, layout, batch, m, n, k): the attention batch matmuls of BERT-base at batch 8, seq
    512 (96 heads of d 64) and Llama at seq 2048."""
    return [
        ("bert attn QK^T", "nt", 96, 512, 512, 64),
        ("bert attn PV", "nn", 96, 512, 64, 512),
        ("llama attn QK^T", "nt", 32, 2048, 2048, 128),
        ("llama attn PV", "nn", 32, 2048, 128, 2048),
    ]
