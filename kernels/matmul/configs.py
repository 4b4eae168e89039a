"""Tile configurations of the library GEMM (gemm.cuh) and the table that picks one from a static
shape. Pure Python, no imports: the model-replacement code can copy or import it.

A config is (BN, S) and its tile rows TM (TILE_ROWS, 128 unless listed): tiles of TM x BN of C,
K split S ways over a thread-block cluster of S CTAs (partials summed by the cluster: S = 2 in
distributed shared memory, S = 4 through per-SM slots in global memory, gemm.cuh). Every config
runs 384 threads with 100352 bytes of dynamic shared memory; its grid is
(ceildiv(n, BN), ceildiv(m, TM), batch * S). The kernel name carries the config as a suffix
("" for the default 128 x 256): e.g. matmul_nt_f16_bias_t128x64_k4.
"""

# suffix -> (BN, split-K S, CTAs per SM R). gemm.cuh also has R = 2 (two CTAs of 288 threads per
# SM, 128 x 128): measured no faster than R = 1 on the H100 (benchmarks/results/gemm-h100-run5.txt),
# so no entries are generated for it.
CONFIGS = {
    "": (256, 1, 1),
    "t128x128": (128, 1, 1),
    "t128x128_k2": (128, 2, 1),
    "t128x64_k4": (64, 4, 1),
    "t128x64_k2": (64, 2, 1),
    "t128x128_p": (128, 1, 1),
    "t64x64": (64, 1, 1),
    "t64x64_k4": (64, 4, 1),
}
# Tile rows (TM in gemm.cuh) where not 128: 64-row tiles have one consumer warpgroup, and twice
# the CTAs of 128-row ones at small m (cuBLAS runs M = 128 with 64-row tiles too). t64x64_k2,
# t64x128 and t64x128_k2 were measured and never the fastest (benchmarks/investigations/gemm_small.py).
TILE_ROWS = {"t64x64": 64, "t64x64_k4": 64}
# persistent configs: a fixed grid of SMS CTAs walking the tiles (gemm.cuh, hopper::persistent)
PERSISTENT = {"t128x128_p"}

EPILOGUES = ["none", "bias", "bias_gelu_erf", "bias_gelu_tanh", "bias_relu", "bias_silu", "residual", "bias_residual",
             "scale"]

SMS = 132  # H100 SXM; an H200 has 132 as well

# Epilogues with erff or expf per element. Where the persistent kernel's consumers take turns
# (ping-pong), one warpgroup runs a tile's whole epilogue alone, and with these that costs more
# than the other's main loop hides: on an H200 at K = 768, bias_gelu_erf took 49.7 us at
# 2048x3072x768 with ping-pong against 39.0 with both warpgroups on each tile
# (benchmarks/results/gemm-mid-h200-round32.txt); on an H100 in round 38, 48.7 against 33.9
# (benchmarks/results/gemm-epilogue-h100-round38.txt). So their persistent entries keep
# cooperative consumers.
TRANSCENDENTAL_EPILOGUES = {"bias_gelu_erf", "bias_gelu_tanh", "bias_silu", "gelu_erf", "gelu_tanh", "silu_mul"}


def pingpong(epilogue):
    """Whether the persistent entry of this epilogue has ping-pong consumers (gemm.cuh, kPingPong)."""
    return epilogue not in TRANSCENDENTAL_EPILOGUES


def grid(cfg, m, n, batch=1):
    if cfg in PERSISTENT:
        return (SMS, 1, 1)
    bn, s, _ = CONFIGS[cfg]
    return (-(-n // bn), -(-m // tile_rows(cfg)), batch * s)


def tile_rows(cfg):
    return TILE_ROWS.get(cfg, 128)


def _ceil(a, b):
    return -(-a // b)


def _score(m, n, bn, batch, slots=SMS):
    """Share of the GPU's tile slots doing useful work: wave quantization x column padding."""
    tiles = batch * _ceil(m, 128) * _ceil(n, bn)
    waves = _ceil(tiles, slots)
    return tiles / (waves * slots) * n / (_ceil(n, bn) * bn)


def choose_config(m, n, k, dtype="f16", batch=1):
    """The config suffix for C[m, n] = A[m, k] B[k, n] (either layout; `batch` matmuls of that
    shape; dtype f16 or bf16: both measured alike), whatever the epilogue (since round 38). The
    f32 kernels have one config.

    Rules (from the H100 measurements in README.md / benchmarks/results/gemm-h100-*.txt,
    gemm-floor-h100.txt and gemm-small-h100-round29*.txt); t64 = batch * ceil(m/64) * ceil(n/64):
      0a. 64 x 64 tiles fill at most one wave (t64 <= 132) and k <= 1024, or k <= 4096 where they
         fill more than half of it (2 t64 > 132): t64x64, no split. Small shapes are
         bound by the prologue (~1.2 us), the rounds of the ring and the split-K sum; 64-row tiles
         give twice the CTAs of 128-row ones with no sum to do (128x768x768 5.2 us against 5.8 for
         t128x64_k4, 128x3072x768 5.4 against 6.9 for t128x64_k2, 512x768x768 5.3 against 6.9).
         Since its stages hold k 128 (round 37) also at deeper K: 128x4096x4096 13.5-13.8 us
         against 14.6-14.8 for t128x64_k2, 512x768x3072 10.1-10.4 against 11.4-11.5 (two runs in
         one lease, benchmarks/results/gemm-small-h100-round37.txt), but not at 128x4096x11008
         (38.3 against 37.6);
      0b. 64 x 64 tiles with K split 4 ways fill at most one wave (4 t64 <= 132) and k >= 2048:
         t64x64_k4 (128x768x3072: 7.2 us against 7.8 for t128x64_k4);
      1. very few 128 x 128 tiles (<= 12) and k >= 768: 128 x 64 tiles, K split 4 ways
         (small M, narrow N: the split fills the GPU);
      2. few 128 x 128 tiles (4 x tiles <= 132: the 128 x 64 tiles of both K halves fit one wave)
         and k >= 512: 128 x 64 tiles, K split 2 ways. Small shapes are bound by how fast one SM
         takes in its tiles (about 110 GB/s an SM through TMA) and by the split-K reduction in
         distributed shared memory (about 1.9 us for 4 partial tiles, half that for 2): twice the
         CTAs of 128 x 128 with half the k each, one partial to add (512x768x768 6.8 us against
         7.7; 128x4096x4096 15.2 against 19.9 for 128 x 128 split 2);
      3. few 128 x 128 tiles (<= 48) and k >= 2048: 128 x 128, K split 2 ways;
      4. many tiles (> 2 x 132) and K up to 1024 or N up to 1024: the persistent 128 x 128
         kernel, whose two consumer warpgroups take turns (one's epilogue under the other's
         wgmmas) while the producer loads ahead across tiles: attention's Q K^T and P V, and
         BERT/GPT-2/ViT layers from about 2048 tokens (H200, round 32: 8192x3072x768 72.6 us
         against 76.7 for 128 x 256, bias 78.5 against 84.3; benchmarks/results/gemm-mid-h200-round32.txt).
         Since sm_90a objects have 183296 bytes of dynamic shared memory (5 stages, was 3) it is
         also the fastest at N = 768, K = 3072 (H100, round 35: 8192x768x3072 58.7 us against
         75.0 for t128x128; b32 2048x128x2048 110.9 against 112.5;
         benchmarks/results/gemm-h100-round35.txt). Every epilogue alike since round 38 (the
         TRANSCENDENTAL_EPILOGUES with cooperative consumers had gone to rules 5 and 6 at K > 256):
         with gemm.cuh's sigmoid forms of SiLU and tanh-GELU and the epilogue's loads issued ahead,
         on an H100 the cooperative persistent kernel against the best of t128x128 and 128 x 256
         took, for GELU erf / GELU tanh / SiLU / silu_mul, 33.3 / 28.2 / 26.7 / 32.3 us against
         36.9 / 34.6 / 34.1 / 35.9 at 2048x3072x768, 113.0 / 100.3 / 94.0 / 114.6 against
         113.6 / 105.5 / 102.3 / 133.5 at 8192x3072x768, 72.8 / 67.3 / 66.3 / 70.6 against
         84.4 / 82.4 / 82.1 / 82.6 at 8192x768x3072, 88.6 / 84.0 / 83.6 / 86.9 against
         96.4 / 94.5 / 94.0 / 93.9 at 512x11008x4096; GELU erf is 3% behind at 4096x3072x768
         (60.5 against 58.9), and at 2048x11008x4096 128 x 256 was 2-5% ahead for every epilogue
         in that run, "none" included, where round 37 had the persistent kernel 3% ahead
         (benchmarks/results/gemm-epilogue-h100-round38.txt, run E).
         Also for wide N (>= 8192) up to 1536 tiles, whatever K: Llama's
         gate/up projection at 512 and 2048 tokens (H100, round 37: 512x11008x4096 76.1 us against
         84.5 for t128x128, 2048x11008x4096 277.7 against 286.2 for 128 x 256; round 35 measured
         the same; benchmarks/results/gemm-h100-round37.txt), not at 8192 tokens (5504 tiles:
         1093 against 1047 for 128 x 256) nor at N = 4096 (2048x4096x4096: 102.8 against 96.1);
      5. 128 x 128 tiles when they use the GPU's tile slots clearly better than 128 x 256 ones
         (wave quantization x column padding, 15% margin);
      6. otherwise the default 128 x 256.
    At every shape of benchmarks/gemm.py this picks the fastest measured config or one within 2%,
    but 128x11008x4096 in round 38's run (t128x128 38.6 us against 37.5 for t128x128_p, 1.4%
    apart in round 37's; benchmarks/results/gemm-h100-round38.txt).
    """
    t64 = batch * _ceil(m, 64) * _ceil(n, 64)
    if t64 <= SMS and (k <= 1024 or k <= 4096 and 2 * t64 > SMS):
        return "t64x64"
    if 4 * t64 <= SMS and k >= 2048:
        return "t64x64_k4"
    t128 = batch * _ceil(m, 128) * _ceil(n, 128)
    if t128 <= 12 and k >= 768:
        return "t128x64_k4"
    if 4 * t128 <= SMS and k >= 512:
        return "t128x64_k2"
    if t128 <= 48 and k >= 2048:
        return "t128x128_k2"
    if t128 > 2 * SMS and (k <= 1024 or n <= 1024 or n >= 8192 and t128 <= 1536):
        return "t128x128_p"
    if _score(m, n, 128, batch) > 1.15 * _score(m, n, 256, batch):
        return "t128x128"
    return ""


# The configs in the order a manifest lists them: the kit takes the first kernel whose
# `replace_when.when` holds, so that listing the conditions below in this order picks what
# choose_config picks (tests/test_library_gemm.py checks it over a grid of shapes).
CONFIG_ORDER = ["t64x64", "t64x64_k4", "t128x64_k4", "t128x64_k2", "t128x128_k2", "t128x128_p", "t128x128", ""]


def config_conditions(batched):
    """{config: the manifest condition (replace_when.when) of choose_config's rule for it}, for
    every epilogue's entries, over the kernel's sizes m, n, k (and batch). Rule 5 compares shares of the tile slots:
    tiles / (waves * SMS) * n / (ceil(n, BN) * BN), where tiles = batch * ceil(m, 128) *
    ceil(n, BN); the ratio of the 128- and 256-wide scores is 2 * waves256 / waves128, so
    "better than 1.15x" is 40 * waves256 > 23 * waves128 in integers."""
    b = "batch * " if batched else ""
    t64 = f"{b}ceildiv(m, 64) * ceildiv(n, 64)"
    t128 = f"{b}ceildiv(m, 128) * ceildiv(n, 128)"
    t256 = f"{b}ceildiv(m, 128) * ceildiv(n, 256)"
    narrow = f"40 * ceildiv({t256}, {SMS}) > 23 * ceildiv({t128}, {SMS})"
    return {
        "t64x64": f"{t64} <= {SMS} && (k <= 1024 || k <= 4096 && 2 * {t64} > {SMS})",
        "t64x64_k4": f"4 * {t64} <= {SMS} && k >= 2048",
        "t128x64_k4": f"{t128} <= 12 && k >= 768",
        "t128x64_k2": f"4 * {t128} <= {SMS} && k >= 512",
        "t128x128_k2": f"{t128} <= 48 && k >= 2048",
        "t128x128_p": f"{t128} > {2 * SMS} && (k <= 1024 || n <= 1024 || n >= 8192 && {t128} <= 1536)",
        "t128x128": narrow,
        "": None,
    }


# The f32 kernels' configs (gemm_f32.cuh): suffix -> (tile rows TM, split-K S). Tiles of TM x 128,
# 2 * TM threads; S > 1: the K split over a cluster of S CTAs on sm_90a (elsewhere split 0
# computes the whole k). Grid (ceildiv(n, 128), ceildiv(m, TM), batch * S). gemm_f32.cuh takes any
# TM in {64, 128} with any S in {1, 2, 4, 8}; 128 x 128 with a split was measured and not
# generated: it never beat 64 x 128 with the same CTA count (benchmarks/results/gemm-f32-h100-round39.txt).
# 64 x 128 unsplit is within 2% of 128 x 128 in 3xTF32 at the linear layers' shapes and 20-30%
# slower in TF32 (two 128 x 128 CTAs fit an SM at TF32's 114-128 registers), but 3-6% faster at
# k = 64, attention's Q K^T (round 40, gemm-f32-h100-round40.txt).
# suffix -> (TM, BN, S). The 64-wide tiles take n <= 64 (attention's P V, n = the head dim),
# where half of a 128-wide tile would be past n.
F32_CONFIGS = {
    "": (128, 128, 1),
    "t64x128": (64, 128, 1),
    "t64x128_k2": (64, 128, 2),
    "t64x128_k4": (64, 128, 4),
    "t64x128_k8": (64, 128, 8),
    "t128x64": (128, 64, 1),
    "t64x64": (64, 64, 1),
    "t64x64_k2": (64, 64, 2),
    "t64x64_k4": (64, 64, 4),
    "t64x64_k8": (64, 64, 8),
}
F32_SMEM = {(128, 128): 81920, (64, 128): 61440, (128, 64): 61440, (64, 64): 40960}  # gemm_f32.cuh's smem_bytes<TM, BN>()
# choose_config_f32's rules, in order: (config, most 64 x 128 tiles, least k, most k; None: no
# bound). A config's rules are adjacent, so its manifest condition is their disjunction. n > 64:
F32_RULES = [
    ("t64x128_k8", 24, 512, None),
    ("t64x128_k4", 24, 64, None),
    ("t64x128_k4", 160, 768, None),
    ("t64x128_k2", 640, 128, None),
    ("t64x128", None, None, 127),
]
# n <= 64: 64-wide tiles, whose CTAs do half the work of 128-wide ones, so that splits pay from a
# shallower k.
F32_NARROW_RULES = [
    ("t64x64_k8", 24, 128, None),
    ("t64x64_k4", 160, 256, None),
    ("t64x64_k2", 640, 128, None),
    ("t64x64", None, None, 127),
]
F32_DEFAULT, F32_NARROW_DEFAULT = "", "t128x64"  # where no rule holds
# In manifest order: the first whose f32_config_conditions() holds is choose_config_f32's (the
# narrow ones first: they hold only where n <= 64).
F32_CONFIG_ORDER = ([c for c, *_ in F32_NARROW_RULES] + [F32_NARROW_DEFAULT] + list(dict.fromkeys(c for c, *_ in F32_RULES))
                    + [F32_DEFAULT])


def _first_rule(rules, t64, k, default):
    return next((config for config, most_tiles, least_k, most_k in rules
                 if (most_tiles is None or t64 <= most_tiles) and (least_k is None or k >= least_k) and (most_k is None or k <= most_k)),
                default)


def choose_config_f32(m, n, k, batch=1):
    """The f32 config suffix for C[m, n] = A[m, k] B[k, n] (either layout, 3xTF32 or TF32;
    `batch` matmuls of that shape: the batched entries take the same rules over all its tiles).

    A 3xTF32 CTA of 128 x 128 takes 221-227 registers a thread, so one fits an SM; one of 64 x 128
    (128 threads) two. Where the 128 x 128 tiles leave SMs idle, 64 x 128 tiles with K split S
    ways over a cluster fill them. With t64 = batch ceil(m/64) ceil(n/128), the tiles of 64 x 128,
    the first rule that holds (F32_RULES), for n > 64:
      1. t64 <= 24 and k >= 512: split 8 (BERT/GPT-2 at 128 tokens, N = 768: 12.0 us against
         86.3 for 128 x 128 at 128x768x768, 33.3 against 332.2 at 128x768x3072; cuBLAS SGEMM
         11.0 and 22.3);
      2. t64 <= 24 and k >= 64: split 4 (attention's Q K^T at 128 tokens, 12x128x128x64: 5.5 us
         against 7.8 unsplit and 7.2 for split 2);
      3. t64 <= 160 and k >= 768: split 4 (128x3072x768 25.0 us against 92.6; 512x2304x768 64.5
         against 84.6, where split 2 took 77.5 and split 8 69.5);
      4. t64 <= 640 and k >= 128: split 2 (512x3072x768 and 2048x768x768 75.4 against 84.5 for 64
         x 128 unsplit and 86.1 for split 4; 2048x2304x768 201.3 against 258.6);
      5. k < 128: 64 x 128, no split (Q K^T at k = 64: 12x512x512x64 17.7 us against 20.3 for
         128 x 128, 12x2048x2048x64 211.8 against 225.0, 96x512x512x64 111.2 against 117.5);
      6. otherwise 128 x 128, no split (2048x3072x768 253.1 us, the best 250.9; 8192x768x3072 987.7,
         the best 952.3, split 2).
    For n <= 64, 64-wide tiles by F32_NARROW_RULES (attention's P V, n = 64): split 8 where
    t64 <= 24 and k >= 128 (12x128x64x128 5.7 us against 6.8 for split 4), split 4 where t64 <= 160
    and k >= 256 (12x512x64x512 19.2 against 26.3 for split 2 and 31.7 for the best 128-wide
    config), split 2 where t64 <= 640 and k >= 128 (12x2048x64x2048 209.0 against 329.2 128-wide),
    64 x 64 where k < 128, else 128 x 64 (96x512x64x512 93.5 against 161.5 128-wide).
    H100 figures, 3xTF32: benchmarks/results/gemm-f32-h100-round39.txt (linear) and
    gemm-f32-h100-round40.txt (batched). At every shape of F32_SHAPES and F32_BMM_SHAPES this
    picks the fastest measured config or one within 4%."""
    t64 = batch * _ceil(m, 64) * _ceil(n, 128)
    if n <= 64:
        return _first_rule(F32_NARROW_RULES, t64, k, F32_NARROW_DEFAULT)
    return _first_rule(F32_RULES, t64, k, F32_DEFAULT)


def f32_config_conditions(batched=False):
    """{config: the manifest condition (replace_when.when) of choose_config_f32's rules for it},
    over the kernel's sizes m, n, k (and batch): the first in F32_CONFIG_ORDER that holds is the
    config choose_config_f32 picks."""
    t64 = ("batch * " if batched else "") + "ceildiv(m, 64) * ceildiv(n, 128)"

    def conditions_of(rules, guard=None):
        alternatives = {}
        for config, most_tiles, least_k, most_k in rules:
            terms = [term for bound, term in ((most_tiles, f"{t64} <= {most_tiles}"), (least_k, f"k >= {least_k}"),
                                              (most_k, f"k <= {most_k}")) if bound is not None]
            alternatives.setdefault(config, []).append(" && ".join(terms))
        joined = {config: " || ".join(f"({a})" if len(alts) > 1 else a for a in alts) for config, alts in alternatives.items()}
        return {config: f"{guard} && ({text})" if guard else text for config, text in joined.items()}

    return {**conditions_of(F32_NARROW_RULES, "n <= 64"), F32_NARROW_DEFAULT: "n <= 64", **conditions_of(F32_RULES), F32_DEFAULT: None}


# Shapes of the measured model layers (README.md's table): (m, n, k) or (m, n, k, dtype, batch).
SHAPES = [(128, 768, 768), (512, 512, 64, "f16", 96), (512, 64, 512, "f16", 96), (2048, 2048, 128, "f16", 32),
          (128, 3072, 768), (128, 768, 3072), (128, 4096, 4096), (128, 11008, 4096), (128, 4096, 11008),
          (512, 768, 768), (2048, 768, 3072), (2048, 3072, 768), (8192, 768, 768), (8192, 2304, 768),
          (4096, 4096, 4096), (8192, 8192, 8192)]

# f32 matmuls of BERT-base / GPT-2 small layers at 128-8192 tokens (f32 ONNX exports: B [k, n]),
# and a square: benchmarks/gemm.py times every f32 config at these.
F32_SHAPES = [(128, 768, 768), (128, 2304, 768), (128, 3072, 768), (128, 768, 3072), (512, 768, 768), (512, 2304, 768),
              (512, 3072, 768), (512, 768, 3072), (2048, 768, 768), (2048, 2304, 768), (2048, 3072, 768),
              (2048, 768, 3072), (8192, 768, 3072), (4096, 4096, 4096)]

# f32 attention batch matmuls, (label, batch, m, n, k): BERT-base / GPT-2 (12 heads of d 64) at
# batch 1 and 128, 512, 2048 tokens, and batch 8 at 512 (96 heads).
F32_BMM_SHAPES = [(f"attn {what} b{b} s{s}", 12 * b, s, n, k)
                  for b, s in ((1, 128), (1, 512), (1, 2048), (8, 512))
                  for what, n, k in (("QK^T", s, 64), ("PV", 64, s))]


if __name__ == "__main__":
    for shape in SHAPES:
        print(shape, repr(choose_config(*shape)))
