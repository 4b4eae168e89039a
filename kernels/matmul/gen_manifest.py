"""Writes kitdispatch.toml (the library's matmul manifest: the original six and the GEMM family)
and the generated entry files (matmul_nn.cu, matmul_nt.cu, bmm.cu, matmul_f32.cu) of
the library GEMM (gemm.cuh, gemm_f32.cuh). Run from anywhere: `python kernels/matmul/gen_manifest.py`.

Each generated entry is compiled only where its kernel is in the build: it sits inside
`#ifdef KITGEMM_ENTRY_<name>`, a define its manifest entry carries (a model build compiles the
kernels its ops use, not the family). The "none"-epilogue entries with f32 results replace a
model's matmuls (README.md "Kernels inside models"): per shape, the config choose_config picks,
as a `replace_when.when` condition per config (configs.config_conditions), listed in
configs.CONFIG_ORDER so that the first that holds is choose_config's.

Names: {matmul|bmm}_{nn|nt}_{in}[_f32]_{epilogue}[_{config}]
  in        f16 | bf16 (A and B); the result has the input's type unless `_f32` is named.
  epilogue  none | bias | bias_gelu_erf | bias_gelu_tanh | bias_relu | bias_silu | residual |
            bias_residual | scale   (exact formulas: README.md, gemm.cuh); the f16/bf16 matmuls
            also gelu_erf | gelu_tanh | silu_mul (MODEL_EPILOGUES)
  config    t128x128 | t128x128_k2 | t128x64_k4 | t128x64_k2 | t128x128_p | t64x64 | t64x64_k4;
            none named = 128 x 256 tiles.
            Which to use for a shape: configs.choose_config(m, n, k, dtype).
The six original entries (matmul_f16, ..., in matmul.cu) are kept as they were.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from configs import (CONFIG_ORDER, CONFIGS, EPILOGUES, F32_CONFIG_ORDER, F32_CONFIGS, F32_SMEM, PERSISTENT, SMS,  # noqa: E402
                     config_conditions, f32_config_conditions, pingpong, tile_rows)

# Epilogues exported models have beyond EPILOGUES (f16/bf16 matmuls only): GELU where the
# exporter folded a zero bias away (GPT-2's c_fc), and SwiGLU's silu(x Wg) * (x Wu) (Llama's MLP,
# which IREE fuses into the gate matmul's dispatch).
MODEL_EPILOGUES = ["gelu_erf", "gelu_tanh", "silu_mul"]

# The bias add of a Q, K or V projection stored in attention's heads layout (the transposing
# generic BERT/ViT exports leave after the projection): C[m, n] with m = bi * seq + si and
# n = hi * d + di at [bi, hi, si, di] ("bias_heads", Q and V) or [bi, hi, di, si] ("bias_heads_t",
# K^T). f16/bf16 only, in the configs choose_config picks for the projections of BERT and ViT
# (m = 128 .. 4096 tokens, n = k = 768): not the whole family.
HEADS_EPILOGUES = ["bias_heads", "bias_heads_t"]
HEADS_CONFIGS = ["t64x64", "t128x128", ""]
HEADS_OUT = {"bias_heads": "nb,heads,seq,d", "bias_heads_t": "nb,heads,d,seq"}

SMEM = 100352
# gemm.cuh's kDynamicSmem on sm_90a: its deeper rings (the 227 KiB a Hopper block may have, less
# the 48 KB static stage of 128 x 256 tiles). The manifest's table gives the sm_90a objects this.
SMEM_SM90A = 183296
THREADS = 384

# kind -> (source file, layouts, (in, out) pairs, epilogues)
FAMILIES = [
    ("matmul", "nt", "matmul_nt.cu", [("f16", "f16"), ("bf16", "bf16")], EPILOGUES + MODEL_EPILOGUES),
    ("matmul", "nt", "matmul_nt.cu", [("f16", "f32"), ("bf16", "f32")], ["none", "bias"]),
    ("matmul", "nn", "matmul_nn.cu", [("f16", "f16"), ("bf16", "bf16")], EPILOGUES + MODEL_EPILOGUES),
    ("matmul", "nn", "matmul_nn.cu", [("f16", "f32"), ("bf16", "f32")], ["none", "bias"]),
    ("bmm", "nt", "bmm.cu", [("f16", "f16"), ("bf16", "bf16"), ("f16", "f32"), ("bf16", "f32")], ["none", "scale"]),
    ("bmm", "nn", "bmm.cu", [("f16", "f16"), ("bf16", "bf16"), ("f16", "f32"), ("bf16", "f32")], ["none", "scale"]),
]

CTYPE = {"f16": "unsigned short", "bf16": "unsigned short", "f32": "float"}
KTYPE = {"f16": "kit::F16", "bf16": "kit::BF16", "f32": "kit::F32"}
EPI_ENUM = {
    "none": "kNone", "bias": "kBias", "bias_gelu_erf": "kBiasGeluErf", "bias_gelu_tanh": "kBiasGeluTanh",
    "bias_relu": "kBiasRelu", "bias_silu": "kBiasSilu", "residual": "kResidual", "bias_residual": "kBiasResidual",
    "scale": "kScale", "gelu_erf": "kGeluErf", "gelu_tanh": "kGeluTanh", "silu_mul": "kSiluMul",
    "bias_heads": "kBiasHeads", "bias_heads_t": "kBiasHeadsT",
}


def kernel_name(kind, layout, ti, to, epi, cfg):
    out = "" if to == ti else "_" + to
    return f"{kind}_{layout}_{ti}{out}_{epi}" + (f"_{cfg}" if cfg else "")


# The f32 entries (gemm_f32.cuh, in matmul_f32.cu): kind -> epilogues. The batched ones have the
# f16/bf16 bmm's (attention's Q K^T, maybe scaled, and P V).
F32_FAMILIES = {"matmul": EPILOGUES, "bmm": ["none", "scale"]}


def entries():
    for kind, epis in F32_FAMILIES.items():
        for layout in ("nn", "nt"):
            for prec in ("tf32", ""):  # plain TF32 first: with --tf32 it wins where both fit
                for epi in epis:
                    for cfg in F32_CONFIG_ORDER:
                        tm, bn, s = F32_CONFIGS[cfg]
                        ti = "f32_tf32" if prec else "f32"
                        yield dict(kind=kind, layout=layout, src="matmul_f32.cu", ti="f32", to="f32", epi=epi, cfg=cfg,
                                   bn=bn, tm=tm, s=s, r=1, prec=prec or "3xtf32", threads=tm * bn // 64, smem=F32_SMEM[(tm, bn)],
                                   name=f"{kind}_{layout}_{ti}_{epi}" + (f"_{cfg}" if cfg else ""))
    for kind, layout, src, types, epis in FAMILIES:
        for ti, to in types:
            for epi in epis:
                for cfg in CONFIG_ORDER:
                    bn, s, r = CONFIGS[cfg]
                    yield dict(kind=kind, layout=layout, src=src, ti=ti, to=to, epi=epi, cfg=cfg, bn=bn, s=s, r=r, tm=tile_rows(cfg),
                               persistent=cfg in PERSISTENT,
                               prec="", threads=THREADS if r == 1 else 288, smem=SMEM, smem_sm90a=SMEM_SM90A,
                               name=kernel_name(kind, layout, ti, to, epi, cfg))
    for layout in ("nn", "nt"):
        for ti in ("f16", "bf16"):
            for epi in HEADS_EPILOGUES:
                for cfg in HEADS_CONFIGS:
                    bn, s, r = CONFIGS[cfg]
                    yield dict(kind="matmul", layout=layout, src=f"matmul_{layout}.cu", ti=ti, to=ti, epi=epi, cfg=cfg, bn=bn, s=s, r=r,
                               tm=tile_rows(cfg), persistent=False, prec="", threads=THREADS, smem=SMEM, smem_sm90a=SMEM_SM90A,
                               name=kernel_name("matmul", layout, ti, ti, epi, cfg))


def shared_memory(e):
    """The manifest's dynamic_shared_memory: a table where sm_90a objects take more."""
    if "smem_sm90a" not in e:
        return str(e["smem"])
    return f"{{ default = {e['smem']}, sm_90a = {e['smem_sm90a']} }}"


def launch_shared_memory(e, capability):
    """The bytes a direct launch of entry `e` on a GPU of compute capability `capability`
    (major * 10 + minor) gives, as the manifest's table does for its object (sm_90a SASS on 90)."""
    return e.get("smem_sm90a", e["smem"]) if capability == 90 else e["smem"]


def params(e):
    """[(name, manifest access, C declaration)] in C order."""
    bat = e["kind"] == "bmm"
    pre = "batch," if bat else ""
    ti, to = e["ti"], e["to"]
    b_shape = "n,k" if e["layout"] == "nt" else "k,n"
    b_name = "w" if e["layout"] == "nt" else "b"
    ps = [
        ("a", f'in = "{ti}[{pre}m,k]"', f"const {CTYPE[ti]}* __restrict__ a"),
        (b_name, f'in = "{ti}[{pre}{b_shape}]"', f"const {CTYPE[ti]}* __restrict__ {b_name}"),
    ]
    epi = e["epi"]
    if epi in HEADS_OUT:  # bias [heads, d] as the model holds it; nb and seq: the result's other dims
        return ps + [
            ("bias", f'in = "{to}[heads,d]"', f"const {CTYPE[to]}* __restrict__ bias"),
            ("c", f'out = "{to}[{HEADS_OUT[epi]}]"', f"{CTYPE[to]}* __restrict__ c"),
            ("nb", 'scalar = "i32"', "int nb"), ("seq", 'scalar = "i32"', "int seq"),
            ("m", 'scalar = "i32"', "int m"), ("n", 'scalar = "i32"', "int n"), ("k", 'scalar = "i32"', "int k"),
            ("d", 'scalar = "i32"', "int d"),
        ]
    if epi.startswith("bias"):
        ps.append(("bias", f'in = "{to}[n]"', f"const {CTYPE[to]}* __restrict__ bias"))
    if epi.endswith("residual"):
        ps.append(("residual", f'in = "{to}[{pre}m,n]"', f"const {CTYPE[to]}* __restrict__ residual"))
    if epi == "silu_mul":
        ps.append(("up", f'in = "{to}[{pre}m,n]"', f"const {CTYPE[to]}* __restrict__ up"))
    ps.append(("c", f'out = "{to}[{pre}m,n]"', f"{CTYPE[to]}* __restrict__ c"))
    if epi == "scale":
        ps.append(("alpha", 'scalar = "f32"', "float alpha"))
    if epi in ("bias_gelu_tanh", "gelu_tanh"):
        ps.append(("gelu_c", 'scalar = "f32"', "float gelu_c"))
    if bat:
        ps.append(("batch", 'scalar = "i32"', "int batch"))
    ps += [("m", 'scalar = "i32"', "int m"), ("n", 'scalar = "i32"', "int n"), ("k", 'scalar = "i32"', "int k")]
    return ps


def guard(e):
    """The define that compiles an entry in (each manifest entry carries its own)."""
    return f"KITGEMM_ENTRY_{e['name']}"


def c_entry(e):
    return f"#ifdef {guard(e)}\n{_c_function(e)}#endif\n"


def _c_function(e):
    ps = params(e)
    decl = ", ".join(p[2] for p in ps)
    names = {p[0] for p in ps}
    bias = "bias" if "bias" in names else "nullptr"
    res = "residual" if "residual" in names else ("up" if "up" in names else "nullptr")
    scalar = "alpha" if "alpha" in names else ("gelu_c" if "gelu_c" in names else "0.0f")
    batch = "batch" if "batch" in names else "1"
    b = "w" if e["layout"] == "nt" else "b"
    nt = "true" if e["layout"] == "nt" else "false"
    heads = ", seq, d" if e["epi"] in HEADS_OUT else ""
    tmpl = f"{KTYPE[e['ti']]}, {KTYPE[e['to']]}, {nt}, {e['bn']}, {e['s']}, kitgemm::{EPI_ENUM[e['epi']]}, {e['r']}"
    if e.get("tm", 128) != 128:
        tmpl += f", {e['tm']}"
    cluster = f" KIT_SPLIT_K({e['s']})" if e["s"] > 1 else ""
    if e.get("persistent"):
        return (
            f'extern "C" __global__ void __launch_bounds__({e["threads"]}, 1)\n{e["name"]}({decl}) {{\n'
            f"  kitgemm::gemm_persistent<{KTYPE[e['ti']]}, {KTYPE[e['to']]}, {nt}, {e['bn']}, kitgemm::{EPI_ENUM[e['epi']]}, "
            f"{'true' if pingpong(e['epi']) else 'false'}>"
            f"(a, {b}, c, kitgemm::EpiArgs<{KTYPE[e['to']]}>{{{bias}, {res}, {scalar}}}, {batch}, m, n, k);\n}}\n"
        )
    if e["ti"] == "f32":
        k3x = "true" if e["prec"] == "3xtf32" else "false"
        return (
            f'extern "C" __global__ void __launch_bounds__({e["threads"]}){cluster}\n{e["name"]}({decl}) {{\n'
            f"  kitgemm::f32mm::matmul<{nt}, {k3x}, kit::F32, kitgemm::{EPI_ENUM[e['epi']]}, {e['tm']}, {e['s']}, {e['bn']}>(a, {b}, c, "
            f"kitgemm::EpiArgs<kit::F32>{{{bias}, {res}, {scalar}}}, {batch}, m, n, k);\n}}\n"
        )
    return (
        f'extern "C" __global__ void __launch_bounds__({e["threads"]}, {e["r"]}){cluster}\n{e["name"]}({decl}) {{\n'
        f"  kitgemm::gemm<{tmpl}>(a, {b}, c, kitgemm::EpiArgs<{KTYPE[e['to']]}>{{{bias}, {res}, {scalar}{heads}}}, "
        f"{batch}, m, n, k);\n}}\n"
    )


def toml_entry(e):
    count = [f'"ceildiv(n, {e["bn"]})"', f'"ceildiv(m, {e.get("tm", 128)})"']
    if e.get("persistent"):
        count = [str(SMS), "1"]
    if e.get("persistent"):
        count.append("1")
    elif e["kind"] == "bmm":
        count.append(f'"batch * {e["s"]}"' if e["s"] > 1 else '"batch"')
    else:
        count.append(str(e["s"]))
    lines = [
        "[[kernels]]",
        f'name = "{e["name"]}"',
        f'source = "{e["src"]}"',
        f"workgroup_size = [{e['threads']}]",
        f"workgroup_count = [{', '.join(count)}]",
        f"dynamic_shared_memory = {shared_memory(e)}",
        "params = [",
    ]
    lines += [f'  {{ name = "{n}", {acc} }},' for n, acc, _ in params(e)]
    lines.append("]")
    lines.append(f'defines = ["{guard(e)}"]')
    lines += replaces(e)
    return "\n".join(lines) + "\n"


def replaces(e):
    """The manifest lines saying which model ops an entry replaces (kitdispatch/models/ops/matmul.py
    matches them): every f16/bf16 entry, with its epilogue (epilogue.py recognises it in a model:
    the matmul is replaced together with the elementwise ops that compute it, the cast to an
    f16/bf16 result included) and, per config, the shapes choose_config gives it; the f32 "none"
    entries with their epilogues too, 3xTF32 by default, TF32 on request (their arithmetic)."""
    ops = '["linalg.matmul", "linalg.batch_matmul"]  # batch_matmul: batch 1'
    if patch_conv(e):
        ops = '["linalg.matmul", "linalg.batch_matmul", "patch_conv"]  # batch_matmul: batch 1; patch_conv: its patch rows'
    bmm = e["kind"] == "bmm"
    ops = '["linalg.batch_matmul"]' if bmm else ops
    if e["ti"] == "f32":
        when = f32_config_conditions(bmm)[e["cfg"]]
        keys = [key for key in (epilogue_key(e), f'arithmetic = "{e["prec"]}"', f'when = "{when}"' if when else None) if key]
        return [f"replaces = {ops}", f"replace_when = {{ {', '.join(keys)} }}"]
    when = config_conditions(bmm)[e["cfg"]]
    keys = [key for key in (epilogue_key(e), f'when = "{when}"' if when else None) if key]
    return [f"replaces = {ops}"] + ([f"replace_when = {{ {', '.join(keys)} }}"] if keys else [])


def patch_conv(e):
    """Whether an entry replaces a patch conv too (kitdispatch/models/ops/patch_conv.py): a matmul of
    W [n,k] (the conv's filters, read transposed) whose epilogue adds a bias or nothing."""
    return e["kind"] == "matmul" and e["layout"] == "nt" and e["epi"] in ("none", "bias")


def epilogue_key(e):
    """replace_when's `epilogue` key of an entry, None for "none": the one place it is written."""
    return f'epilogue = "{e["epi"]}"' if e["epi"] != "none" else None


HEADER_CU = """// GENERATED by gen_manifest.py from gemm.cuh / gemm_f32.cuh: do not edit. {what}
// Entry names and exact epilogue formulas: README.md in this folder.
#include "{header}"

"""

TOML_HEAD = """# Tensor-core matmuls of the library: GENERATED by gen_manifest.py (edit that, then run it).
# Build with
#   kitdispatch build kernels/matmul --arch sm_90a,sm_80 -o OUT   (5-8 min on 2 cores; sm_80 alone 3 min)
# A model build compiles only the entries its ops use (each entry's define, KITGEMM_ENTRY_<name>).
#
#
# 1. The original six (matmul.cu): A [m, k] x B [k, n] -> C [m, n], row-major, f16 or bf16 inputs,
#    f32 accumulation, C as f32 (matmul_f16, matmul_bf16) or as the type in the name
#    (matmul_f16_f16, ...). Any m, n, k. 384 threads per 128 x 256 tile of C.
#
# 2. The GEMM family (gemm.cuh; entries and this file GENERATED by gen_manifest.py: edit that):
#      {matmul|bmm}_{nn|nt}_{in}[_f32]_{epilogue}[_{config}]
#    nn: B is [k, n]; nt: B is W [n, k] (nn.Linear's weight, C = A W^T); bmm: every tensor has a
#    leading batch dim (contiguous batches), scalar `batch`. The result has the input's type
#    unless `_f32` is named; bias [n] and residual [m, n] have the result's type. Any m, n, k.
#    Each epilogue is applied in f32 to the f32 accumulator v, then rounded once (RN) to the result:
#      none            v
#      bias            v + f32(bias[c])
#      bias_gelu_erf   x = v + f32(bias[c]); 0.5 * x * (1 + erf(x * 0.70710678))
#      bias_gelu_tanh  x = v + f32(bias[c]); 0.5 * x * (1 + tanh(gelu_c * (x + 0.044715 * x^3)))
#                      gelu_c: f32 argument (0.7978846 for torch/HF, 0.797724 for some exporters)
#      bias_relu       x = v + f32(bias[c]); x < 0 ? 0 : x
#      bias_silu       x = v + f32(bias[c]); x / (1 + exp(-x))
#      residual        v + f32(residual[r, c])
#      bias_residual   (v + f32(bias[c])) + f32(residual[r, c])
#      scale           alpha * v   (alpha: f32 argument)
#    and, for the f16/bf16 matmul_{nn|nt} entries only (what exported models fuse):
#      gelu_erf        0.5 * v * (1 + erf(v * 0.70710678))
#      gelu_tanh       0.5 * v * (1 + tanh(gelu_c * (v + 0.044715 * v^3)))
#      silu_mul        v / (1 + exp(-v)) * f32(up[r, c])   (SwiGLU: the gate matmul, up = x Wu)
#    erf and exp are CUDA's f32 erff and expf (no fast math); tanh-GELU is x / (1 + exp(-2u)).
#    f32: matmul_{nn|nt}_f32_{epilogue} computes by 3xTF32 (a_small*b_big + a_big*b_small +
#    a_big*b_big on the tensor cores, big = tf32(x) by cvt.rna, small = tf32(x - big): f32-level
#    error); matmul_{nn|nt}_f32_tf32_{epilogue} by plain TF32 (a_big*b_big); bmm_{nn|nt}_f32[_tf32]_
#    {none|scale} the same over contiguous batches. Config _tTMxBN[_kS] (unsuffixed: 128 x 128):
#    TM x BN tiles, TM * BN / 64 threads, K split over an S-CTA cluster (partials summed in
#    distributed shared memory), 40960-81920 bytes of dynamic shared memory (configs.F32_SMEM),
#    grid (ceildiv(n, BN), ceildiv(m, TM), batch * S). Choose with
#    configs.choose_config_f32(m, n, k, batch).
#    config (tile, split-K): none = 128 x 256; t128x128; t128x128_k2 (K split over a 2-CTA
#    cluster, partial tiles summed in distributed shared memory); t128x64_k4 (128 x 64, 4-CTA
#    cluster, partials summed through per-SM slots in global memory); t128x64_k2 (128 x 64, 2-CTA
#    cluster); t128x128_p (persistent); t64x64 (64 x 64: TM = 64 rows, one consumer warpgroup);
#    t64x64_k4 (64 x 64, 4-CTA cluster). Choose with configs.choose_config(m, n, k, dtype) (README.md: the table). 384
#    threads for all, and 100352 bytes of dynamic shared memory but 183296 in the sm_90a objects
#    (deeper rings; the build makes an object per architecture); grid (ceildiv(n, BN),
#    ceildiv(m, TM), batch * split), TM = 128 but for t64x*.
# Build with --arch sm_90a,sm_80 (wgmma + TMA on sm_90a; mma.sync on sm_80.. and for k % 8 != 0,
# NN n % 8 != 0 or misaligned inputs).
# Model ops: the "none"-epilogue entries with an f32 result replace linalg.matmul (B [k,n]: nn;
# B read transposed, W [n,k]: nt) and linalg.batch_matmul (bmm; 2-D entries: batch 1); per shape
# the first entry whose `when` holds, which is the config configs.choose_config picks. f32
# matmuls: 3xTF32, or plain TF32 where the model build asks for it (--tf32).
name = "matmul"

"""

TOML_TAIL = """
[test]
reference = "gemm_reference.py"
# Partial tiles in every direction (300 = 2 x 128 + 44 = 4 x 64 + 44, 1000 = 3 x 256 + 232, 264 = 4 x 64 + 8);
# n and k multiples of 8, so sm_90a runs the TMA path. benchmarks/gemm.py and
# tests/test_kernel_library.py run other shapes (odd n and k: the mma.sync path on every GPU).
# `kitdispatch test` checks results from f16/bf16 inputs with the f16/bf16 tolerance, which f32
# accumulation over k = 264 meets.
# The heads entries: 300 rows = nb 3 x seq 100, 1000 columns = 25 heads x d 40.
sizes = { m = 300, n = 1000, k = 264, batch = 3, heads = 25, d = 40 }
scalars = { alpha = 0.125, gelu_c = 0.7978846, nb = 3, seq = 100 }
seed = 0
"""


def legacy_toml():
    """The original six entries (the family's matmul_{nn|nt}_*_f32_none entries replace model
    matmuls in their place, with per-shape configs)."""
    out = []
    for ti, to in [("f16", "f32"), ("bf16", "f32"), ("f16", "f16"), ("bf16", "bf16"), ("f16", "bf16"), ("bf16", "f16")]:
        name = f"matmul_{ti}" if to == "f32" else f"matmul_{ti}_{to}"
        out.append(
            f'[[kernels]]\nname = "{name}"\nsource = "matmul.cu"\nworkgroup_size = [384]\n'
            f'workgroup_count = ["ceildiv(n, 256)", "ceildiv(m, 128)"]\ndynamic_shared_memory = {SMEM}\nparams = [\n'
            f'  {{ name = "a", in = "{ti}[m,k]" }},\n  {{ name = "b", in = "{ti}[k,n]" }},\n  {{ name = "c", out = "{to}[m,n]" }},\n'
            f'  {{ name = "m", scalar = "i32" }},\n  {{ name = "n", scalar = "i32" }},\n  {{ name = "k", scalar = "i32" }},\n]\n'
        )
    return "\n".join(out)


def render():
    """{file name: text} of everything this script writes."""
    es = list(entries())
    by_src = {}
    for e in es:
        by_src.setdefault(e["src"], []).append(e)
    out = {}
    for src, group in by_src.items():
        header = "gemm_f32.cuh" if src == "matmul_f32.cu" else "gemm.cuh"
        out[src] = HEADER_CU.format(what=f"{len(group)} entries.", header=header) + "\n".join(c_entry(e) for e in group)
    tol = ["", "# f32 inputs: 3xTF32 is f32-level (f32 accumulation over k); TF32 rounds each input to 10 bits,",
           "# whose errors over `kitdispatch test`'s k = 264 reach 0.026 near zero (H100, through IREE).", "[test.tolerances]"]
    for e in es:
        if e["ti"] == "f32":
            t = "{ rtol = 1e-4, atol = 1e-4 }" if e["prec"] == "3xtf32" else "{ rtol = 1e-2, atol = 5e-2 }"
            tol.append(f"{e['name']} = {t}")
    out["kitdispatch.toml"] = (TOML_HEAD + legacy_toml() + "\n" + "\n".join(toml_entry(e) for e in es) + TOML_TAIL
                               + "\n".join(tol) + "\n")
    return out, es, by_src


def main():
    out, es, by_src = render()
    for name, text in out.items():
        with open(os.path.join(HERE, name), "w") as f:
            f.write(text)
    print(f"{len(es)} entries in {', '.join(f'{s} ({len(g)})' for s, g in by_src.items())} + 6 in matmul.cu")


if __name__ == "__main__":
    main()
