"""CPU-side checks of the library GEMM family (kernels/matmul): the generated entry files and
manifest are what gen_manifest.py writes, the config table returns real configs, every
config's launch is what the kernels assume, and a model's matmul gets the config the table
picks. GPU checks: benchmarks/gemm.py."""

import importlib.util
import itertools

from conftest import REPO

MATMUL = REPO / "kernels" / "matmul"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"kernels_matmul_{name}", MATMUL / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    import sys

    sys.path.insert(0, str(MATMUL))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(MATMUL))
    return module


def test_generated_files_are_up_to_date():
    gen = _load("gen_manifest")
    out, entries, _ = gen.render()
    for name, text in out.items():
        assert (MATMUL / name).read_text() == text, f"{name} differs from gen_manifest.py's output: run it"
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names))


def test_choose_config_returns_a_config_for_every_shape():
    configs = _load("configs")
    sizes = [1, 64, 127, 128, 512, 768, 2048, 3072, 4096, 8192, 11008]
    for m, n, k in itertools.product(sizes, sizes, sizes):
        for batch in (1, 12):
            assert configs.choose_config(m, n, k, "f16", batch) in configs.CONFIGS


def test_choose_config_classes():
    c = _load("configs").choose_config
    assert c(128, 768, 768) == "t64x64"  # 24 tiles of 64 x 64, k <= 1024: no split
    assert c(512, 768, 768) == "t64x64"  # a BERT/GPT-2 layer at 512 tokens: 96 tiles of 64 x 64
    assert c(128, 3072, 768) == "t64x64"  # 96 tiles
    assert c(128, 768, 3072) == "t64x64_k4"  # small M, narrow N, deep K: 64 x 64 split 4 ways
    assert c(128, 768, 1536) == "t128x64_k4"  # 12 tiles of 128 x 128, 1024 < k < 2048
    assert c(128, 1536, 3072) == "t128x64_k4"  # 48 tiles of 64 x 64: split 4 ways, two waves
    assert c(128, 4096, 4096) == "t64x64"  # 128 tiles of 64 x 64: more than half a wave, k <= 4096
    assert c(512, 768, 3072) == "t64x64"  # 96 tiles of 64 x 64, k <= 4096
    assert c(128, 4096, 11008) == "t128x64_k2"  # few tiles, k > 4096: 128 x 64, K split 2 ways (one wave)
    assert c(512, 2304, 768) == "t128x128"  # 288 tiles of 64 x 64: more than a wave
    assert c(128, 5120, 4096) == "t128x128_k2"  # 40 tiles of 128 x 128 (> 132 / 4), deep K
    assert c(8192, 768, 768) == "t128x128_p"  # narrow N, shallow K, many tiles
    assert c(8192, 3072, 768) == "t128x128_p"  # K <= 1024, many tiles: the ping-pong persistent kernel
    assert c(4096, 768, 3072) == ""  # deep K: 96 tiles of 128 x 256 in one wave
    assert c(512, 512, 64, "f16", 96) == "t128x128_p"  # attention Q K^T
    assert c(4096, 4096, 4096) == ""  # large: 128 x 256
    # wide N, deep K, up to 1536 tiles: the persistent kernel (Llama's gate/up at 512 and 2048 tokens)
    assert c(512, 11008, 4096) == "t128x128_p"
    assert c(2048, 11008, 4096) == "t128x128_p"
    assert c(8192, 11008, 4096) == ""  # 5504 tiles: 128 x 256
    assert c(2048, 4096, 4096) == ""  # N = 4096: 128 x 256


def test_persistent_entries_take_turns_unless_their_epilogue_is_costly():
    """Each generated t128x128_p entry passes gemm_persistent's kPingPong as configs.pingpong says:
    false exactly for the GELU and SiLU epilogues."""
    configs, gen = _load("configs"), _load("gen_manifest")
    persistent = [e for e in gen.entries() if e["cfg"] == "t128x128_p"]
    assert persistent
    sources = {src: (MATMUL / src).read_text() for src in {e["src"] for e in persistent}}
    for e in persistent:
        text = sources[e["src"]]
        body = text[text.index(f"\n{e['name']}("):]
        call = body[body.index("gemm_persistent<"):body.index(">(")]
        expected = "false" if e["epi"] in configs.TRANSCENDENTAL_EPILOGUES else "true"
        assert call.rstrip().endswith(expected), (e["name"], call)


def test_the_manifest_gives_each_architecture_the_shared_memory_the_kernel_lays_out():
    """gemm.cuh's kDynamicSmem per architecture is what the manifest's table reserves: a launch
    with less traps (require_dynamic_smem), one with more wastes what deeper rings could use."""
    import re

    gen = _load("gen_manifest")
    source = (MATMUL / "gemm.cuh").read_text()
    hopper, other = re.search(
        r"#if defined\(__CUDA_ARCH_FEAT_SM90_ALL\)\n#define KITGEMM_DYNAMIC_SMEM (\d+)\n#else\n#define KITGEMM_DYNAMIC_SMEM (\d+)", source
    ).groups()
    assert (int(hopper), int(other)) == (gen.SMEM_SM90A, gen.SMEM)
    assert "require_dynamic_smem();" in source


def test_manifest_launches_match_the_configs():
    from kitdispatch import load_manifest

    configs = _load("configs")
    spec = load_manifest(MATMUL)
    by_name = {k.name: k for k in spec.kernels}
    gen = _load("gen_manifest")
    for e in gen.entries():
        kernel = by_name[e["name"]]
        assert list(kernel.workgroup_size)[0] == e["threads"]
        assert (kernel.shared_memory_for("sm_80"), kernel.shared_memory_for("sm_90a")) == (e["smem"], e.get("smem_sm90a", e["smem"]))
        if e["ti"] == "f32":  # grid (ceildiv(n, BN), ceildiv(m, TM), batch * S), TM BN / 64 threads, gemm_f32.cuh's <TM, S, BN>
            tm, bn, s = configs.F32_CONFIGS[e["cfg"]]
            z = str(s) if e["kind"] == "matmul" else "batch" + (f" * {s}" if s > 1 else "")
            assert [str(x) for x in kernel.workgroup_count] == [f"ceildiv(n, {bn})", f"ceildiv(m, {tm})", z], e["name"]
            assert (", batch, m, n, k);" if e["kind"] == "bmm" else ", 1, m, n, k);") in gen.c_entry(e), e["name"]
            assert (e["threads"], e["smem"]) == (tm * bn // 64, configs.F32_SMEM[(tm, bn)])
            assert f", {tm}, {s}, {bn}>(a, " in gen.c_entry(e), e["name"]
            assert ("KIT_SPLIT_K" in gen.c_entry(e)) == (s > 1), e["name"]
        else:
            bn, s, _ = configs.CONFIGS[e["cfg"]]
            assert (bn, s) == (e["bn"], e["s"])
            if not e.get("persistent"):  # grid (ceildiv(n, BN), ceildiv(m, TM), ...): TM from the config
                assert str(list(kernel.workgroup_count)[1]) == f"ceildiv(m, {configs.tile_rows(e['cfg'])})", e["name"]
                tm = f", {configs.tile_rows(e['cfg'])}>" if configs.tile_rows(e["cfg"]) != 128 else f", {e['r']}>"
                assert tm in gen.c_entry(e), e["name"]  # the kernel is instantiated with that TM


# --------------------------------------------------------- the config a model's op gets


def _model_matmul(m, n, k, dtype="f16", batch=None, layout="nt"):
    """A matmul as IREE gives it at the matching stage: f16 x f16 -> f32 into a zero fill."""
    lead = f"{batch}x" if batch else ""
    a, c = f"tensor<{lead}{m}x{k}x{dtype}>", f"tensor<{lead}{m}x{n}xf32>"
    b = f"tensor<{lead}{n}x{k}x{dtype}>" if layout == "nt" else f"tensor<{lead}{k}x{n}x{dtype}>"
    d = "d0, " if batch else ""
    i, j, r = ("d1", "d2", "d3") if batch else ("d0", "d1", "d2")
    loops = "(d0, d1, d2, d3)" if batch else "(d0, d1, d2)"
    b_map = f"({d}{j}, {r})" if layout == "nt" else f"({d}{r}, {j})"
    maps = f"[affine_map<{loops} -> ({d}{i}, {r})>, affine_map<{loops} -> {b_map}>, affine_map<{loops} -> ({d}{i}, {j})>]"
    op = "linalg.batch_matmul" if batch else "linalg.matmul"
    return f"""
func.func @f(%a: {a}, %b: {b}) -> {c} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {c}
  %acc = linalg.fill ins(%z : f32) outs(%e : {c}) -> {c}
  %r = {op} indexing_maps = {maps} ins(%a, %b : {a}, {b}) outs(%acc : {c}) -> {c}
  return %r : {c}
}}"""


def test_every_listed_shape_gets_the_config_choose_config_picks():
    """The manifest's `replace_when.when` conditions (configs.config_conditions, in
    CONFIG_ORDER) make the first fitting entry the one choose_config names, in both layouts,
    f16 and bf16, 2-D and batched."""
    from conftest import library_matmul_kernels, only, ops_of

    from kitdispatch.models.replace import decide

    configs = _load("configs")
    kernels = library_matmul_kernels()
    for shape in configs.SHAPES:
        m, n, k, _, batch = shape if len(shape) == 5 else (*shape, "f16", None)
        for dtype, layout in itertools.product(("f16", "bf16"), ("nn", "nt")):
            d = only(decide(ops_of(_model_matmul(m, n, k, dtype, batch, layout)), kernels))
            config = configs.choose_config(m, n, k, dtype, batch or 1)
            family = f"{'bmm' if batch else 'matmul'}_{layout}_{dtype}_f32_none"
            assert d.kernel.name == family + (f"_{config}" if config else ""), (shape, dtype, layout, d.reasons)


GRID_SIZES = [1, 64, 127, 128, 129, 256, 384, 512, 768, 1000, 1024, 2048, 2304, 3072, 4096, 8192, 11008]


def _picks_over_grid(conditions_of, order, batches):
    """(m, n, k, batch, the first config in `order` whose manifest condition holds), evaluated as
    the kit does, over a grid of shapes: 2-D (batch 1) with conditions_of(False), batched (each of
    `batches`) with conditions_of(True)."""
    from kitdispatch.describe.index_expr import Condition

    for batched in (False, True):
        conditions = {c: Condition.parse(t, c) for c, t in conditions_of(batched).items() if t}
        for m, n, k in itertools.product(GRID_SIZES, GRID_SIZES, GRID_SIZES):
            for batch in batches if batched else (1,):
                sizes_of = {"m": m, "n": n, "k": k, "batch": batch}
                yield m, n, k, batch, next(c for c in order if c not in conditions or conditions[c].holds(sizes_of))


def test_the_conditions_pick_what_choose_config_picks_over_a_grid():
    """The same, evaluated directly (as the kit does) over many shapes: rule 4's float score
    comparison is an integer one in the manifest."""
    configs = _load("configs")
    for m, n, k, batch, first in _picks_over_grid(configs.config_conditions, configs.CONFIG_ORDER, (3, 96)):
        assert first == configs.choose_config(m, n, k, "f16", batch), (m, n, k, batch)


def test_f32_matmuls_get_the_config_choose_config_f32_picks():
    """f32 model matmuls: the first fitting entry (configs.f32_config_conditions, in
    F32_CONFIG_ORDER) is the one choose_config_f32 names, in 3xTF32 and, with --tf32, TF32."""
    from conftest import library_matmul_kernels, only, ops_of

    from kitdispatch.models.replace import decide

    configs = _load("configs")
    kernels = library_matmul_kernels()
    shapes = [(*shape, None) for shape in configs.F32_SHAPES] + [(m, n, k, b) for _, b, m, n, k in configs.F32_BMM_SHAPES]
    for (m, n, k, batch), layout, tf32 in itertools.product(shapes, ("nn", "nt"), (False, True)):
        d = only(decide(ops_of(_model_matmul(m, n, k, "f32", batch, layout)), kernels, tf32=tf32))
        config = configs.choose_config_f32(m, n, k, batch or 1)
        family = f"{'bmm' if batch else 'matmul'}_{layout}_f32{'_tf32' if tf32 else ''}_none"
        assert d.kernel.name == family + (f"_{config}" if config else ""), ((m, n, k, batch), layout, tf32, d.reasons)


def test_the_f32_conditions_pick_what_choose_config_f32_picks_over_a_grid():
    configs = _load("configs")
    assert set(configs.F32_CONFIG_ORDER) == set(configs.F32_CONFIGS) and configs.F32_CONFIG_ORDER[-1] == ""
    seen = set()
    for m, n, k, batch, first in _picks_over_grid(configs.f32_config_conditions, configs.F32_CONFIG_ORDER, (12, 96)):
        assert first == configs.choose_config_f32(m, n, k, batch), (m, n, k, batch)
        seen.add(first)
    assert seen == set(configs.F32_CONFIGS)  # every config is some shape's


def test_each_generated_entry_is_compiled_only_with_its_define():
    """A model build compiles the entries its ops use: each sits inside #ifdef of the define
    its manifest entry carries."""
    from kitdispatch import load_manifest

    gen = _load("gen_manifest")
    by_name = {k.name: k for k in load_manifest(MATMUL).kernels}
    for e in gen.entries():
        define = f"KITGEMM_ENTRY_{e['name']}"
        assert by_name[e["name"]].defines == (define,)
        assert f"#ifdef {define}\n" in (MATMUL / e["src"]).read_text()
