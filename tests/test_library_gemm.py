"""CPU-side checks of the library GEMM family (kernels/matmul): the generated entry files and
manifest are what gen_manifest.py writes, the config table returns real configs, and every
config's launch is what the kernels assume. GPU checks: benchmarks/gemm.py."""

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
    assert c(128, 768, 3072) == "t128x64_k4"  # small M, narrow N: split K 4 ways
    assert c(128, 4096, 4096) == "t128x128_k2"  # small M, deep K
    assert c(8192, 768, 768) == "t128x128_p"  # narrow N, shallow K, many tiles
    assert c(512, 512, 64, "f16", 96) == "t128x128_p"  # attention Q K^T
    assert c(4096, 4096, 4096) == ""  # large: 128 x 256


def test_manifest_launches_match_the_configs():
    from kitdispatch import load_manifest

    configs = _load("configs")
    spec = load_manifest(MATMUL / "gemm.toml")
    by_name = {k.name: k for k in spec.kernels}
    gen = _load("gen_manifest")
    for e in gen.entries():
        kernel = by_name[e["name"]]
        assert list(kernel.workgroup_size)[0] == e["threads"]
        if e["ti"] != "f32":
            bn, s, _ = configs.CONFIGS[e["cfg"]]
            assert (bn, s) == (e["bn"], e["s"])
