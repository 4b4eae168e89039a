"""Which kernels replace a model's ops: the user's projects in order, then the kit's library
(models/projects.py), through the API and the CLI; a failed build's report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import (
    KERNEL_TOML,
    MATMUL_CU,
    REPO,
    SOFTMAX_CU,
    f32_matmul_entry,
    make_sample_model,
    matmul_model,
    needs_iree_compile,
    report_sizes,
    run_cli,
    softmax_model,
)

from kitdispatch.errors import IreeCompileError, ManifestError, UsageError
from kitdispatch.models import pipeline
from kitdispatch.models.projects import combine, library_projects, model_projects

MATMUL_TOML = """
name = "{module}"

[[kernels]]
name = "matmul_f16"
source = "{src}"
workgroup_size = [128]
workgroup_count = ["ceildiv(n, 128)", "ceildiv(m, 128)"]
params = [
  {{ name = "a", in = "f16[m,k]" }},
  {{ name = "b", in = "f16[k,n]" }},
  {{ name = "c", out = "f32[m,n]" }},
  {{ name = "m", scalar = "i32" }},
  {{ name = "n", scalar = "i32" }},
  {{ name = "k", scalar = "i32" }},
]
replaces = ["linalg.matmul"]
"""


def named_project(root: Path, module: str, toml: str) -> Path:
    root.mkdir(parents=True)
    (root / "kitdispatch.toml").write_text(f'name = "{module}"\n' + toml)
    return root


def softmax_project(root: Path, module: str = "mine") -> Path:
    return named_project(root, module, KERNEL_TOML.format(src=SOFTMAX_CU) + 'replaces = ["linalg.softmax"]\n')


def library_matmul_toml() -> str:
    """The library's matmul_f16 entry, as a project of its own (another module name) that
    declares what it replaces (in the library, the family's entries replace matmuls)."""
    text = (REPO / "kernels" / "matmul" / "kitdispatch.toml").read_text()
    entry = text[text.index("[[kernels]]"):]
    entry = entry[: entry.index("[[kernels]]", 1)]
    return entry.replace('source = "matmul.cu"', f'source = "{MATMUL_CU}"') + 'replaces = ["linalg.matmul"]\n'


LIBRARY_MATMUL = "matmul_nn_f16_f32_none_t64x64"  # what the library gives the f16 -> f32 matmuls below


# ------------------------------------------------------------------ the projects, combined


def test_no_project_is_the_library():
    projects = model_projects(None)
    names = [p.name for p in projects.projects]
    assert names == [p.name for p in library_projects()] and {"softmax", "matmul", "attention"} <= set(names)
    assert projects.library and all(k.replaces is not None for k in projects.module.kernels)
    assert all(k.source.is_absolute() for k in projects.module.kernels)  # each kernel keeps its own folder


def test_the_users_projects_come_first_then_the_library(tmp_path):
    projects = model_projects([softmax_project(tmp_path / "a")])
    assert projects.projects[0].name == "mine" and len(projects.projects) > 1
    first, *rest = projects.module.kernels
    assert first.name == "row_softmax" and first.function == "row_softmax"
    # The library's row_softmax defines the same function: it is told apart by its module's name.
    assert "softmax_row_softmax" in [k.function for k in rest]
    assert projects.names.startswith("mine+")


def test_a_library_folder_given_as_a_project_comes_once():
    projects = model_projects([REPO / "kernels" / "softmax"])
    assert [p.name for p in projects.projects].count("softmax") == 1 and projects.projects[0].name == "softmax"


def test_no_library_keeps_one_project_as_it_is(tmp_path):
    root = softmax_project(tmp_path / "a")
    projects = model_projects(root, library=False)
    assert [p.name for p in projects.projects] == ["mine"] and projects.module is projects.projects[0]


def test_no_project_and_no_library_is_refused():
    with pytest.raises(UsageError, match="no project was given and the library is off") as err:
        model_projects(None, library=False)
    assert err.value.exit_code == 2


def test_kernels_that_cannot_be_told_apart_are_refused_naming_both_projects(tmp_path):
    a, b, c = (softmax_project(tmp_path / n, module="same") for n in "abc")
    told_apart = model_projects([a, b], library=False).module
    assert [k.function for k in told_apart.kernels] == ["row_softmax", "same_row_softmax"]
    with pytest.raises(ManifestError) as err:
        model_projects([a, b, c], library=False)
    text = err.value.render()
    assert f"kernel 'row_softmax' is in both same ({a}) and same ({c})" in text
    assert "rename one" in text and err.value.exit_code == 2


def test_combined_kernels_keep_their_manifests_folders_and_options(tmp_path):
    a = named_project(tmp_path / "a", "first", 'include_dirs = ["inc"]\ndefines = ["A=1"]\n' + KERNEL_TOML.format(src="k.cu") + 'replaces = ["linalg.softmax"]\n')
    (a / "k.cu").write_text("")
    b = named_project(tmp_path / "b", "second", library_matmul_toml())
    from kitdispatch.describe.manifest import load_manifest

    module = combine([load_manifest(a), load_manifest(b)])
    softmax, matmul = module.kernels
    assert softmax.source == a / "k.cu" and softmax.include_dirs == (str(a / "inc"),) and softmax.defines == ("A=1",)
    assert matmul.source == MATMUL_CU and module.source_flags(a / "k.cu") == ((str(a / "inc"),), ("A=1",))


# ------------------------------------------------------------------ builds, through the CLI


def cli(*argv: str) -> tuple[int, str, str]:
    return run_cli("build", *argv, "--arch", "sm_90", "--json")


@needs_iree_compile
def test_the_library_replaces_an_onnx_softmax_with_no_project(tmp_path):
    model = tmp_path / "model.onnx"
    make_sample_model("onnx_softmax", model)
    rc, out, err = cli("--model", str(model), "-o", str(tmp_path / "out"))
    assert rc == 0, err
    matmul, replaced = json.loads(out)["replaced"]  # its f32 MatMul too: the library's 3xTF32 entry
    assert matmul["kernel"] == f32_matmul_entry("matmul_nn_f32_none", *report_sizes(matmul))
    assert replaced["op"] == "linalg.softmax" and replaced["kernel"] == "row_softmax"
    report = json.loads((tmp_path / "out" / "model.replace.json").read_text())
    assert report["library"] and "softmax" in report["projects"]


@needs_iree_compile
def test_the_library_replaces_an_onnx_matmul_with_no_project(tmp_path):
    model = tmp_path / "model.onnx"
    make_sample_model("onnx_matmul", model, "--rows", 256, "--features", 128, "--outputs", 512)
    rc, out, err = cli("--model", str(model), "-o", str(tmp_path / "out"))
    assert rc == 0, err
    [replaced] = json.loads(out)["replaced"]
    assert replaced["kernel"] == "matmul_nn_f16_none_t64x64"  # an ONNX f16 MatMul: with the truncf after it


@needs_iree_compile
def test_two_projects_combine_into_one_build(tmp_path):
    """An f16 matmul and an f32 softmax: one project's kernel each, both in one module."""
    model = tmp_path / "m.mlir"
    model.write_text(matmul_model(m=256, k=128, n=512))
    softmax = softmax_project(tmp_path / "a")
    matmul = named_project(tmp_path / "b", "mm", library_matmul_toml())
    rc, out, err = cli(str(softmax), str(matmul), "--no-library", "--model", str(model), "-o", str(tmp_path / "out"))
    assert rc == 0, err
    [replaced] = json.loads(out)["replaced"]
    assert replaced["kernel"] == "matmul_f16"
    record = json.loads((tmp_path / "out" / "m.model.json").read_text())
    assert record["project"] == "mine+mm"


@needs_iree_compile
def test_the_first_projects_kernel_wins_over_the_librarys(tmp_path):
    model = tmp_path / "m.mlir"
    model.write_text(softmax_model())
    rc, out, err = cli(str(softmax_project(tmp_path / "a")), "--model", str(model), "-o", str(tmp_path / "out"))
    assert rc == 0, err
    [replaced] = json.loads(out)["replaced"]
    assert replaced["kernel"] == "row_softmax" and replaced["function_called"] == "kitdispatch_row_softmax"


@needs_iree_compile
def test_no_library_leaves_what_the_project_cannot_replace(tmp_path):
    """A project of a softmax kernel and a model of an f16 matmul: the library replaces it;
    with --no-library nothing is replaced, the build fails and its report says why."""
    model = tmp_path / "m.mlir"
    model.write_text(matmul_model(m=256, k=128, n=512))
    project = softmax_project(tmp_path / "a")
    rc, out, err = cli(str(project), "--model", str(model), "-o", str(tmp_path / "with"))
    assert rc == 0, err
    assert json.loads(out)["replaced"][0]["kernel"] == LIBRARY_MATMUL
    rc, out, err = cli(str(project), "--no-library", "--model", str(model), "-o", str(tmp_path / "without"))
    assert rc == 1 and "no op of" in err and "has no linalg.matmul" not in out
    report = json.loads(out)  # --json: the report, as written in the folder
    assert report == json.loads((tmp_path / "without" / "m.replace.json").read_text())
    assert report["replaced"] == [] and report["library"] is False and "error" in report


def test_no_library_needs_a_model(tmp_path):
    rc, _, err = run_cli("build", str(tmp_path), "--no-library", "-o", str(tmp_path / "out"))
    assert rc == 2 and "--no-library needs --model" in err


def test_build_without_a_manifest_needs_a_model(tmp_path):
    rc, _, err = run_cli("build", "-o", str(tmp_path / "out"))
    assert rc == 2 and "give a manifest" in err


@needs_iree_compile
def test_a_failed_iree_compile_after_matching_still_writes_the_report(tmp_path, monkeypatch):
    model = tmp_path / "m.mlir"
    model.write_text(softmax_model())
    real = pipeline._run_iree

    def failing(argv: list[str], **kw):
        if any(a.startswith("--compile-from=") for a in argv):
            raise IreeCompileError("iree-compile could not finish the model with its replacements", argv=argv, returncode=1, log="boom")
        return real(argv, **kw)

    monkeypatch.setattr(pipeline, "_run_iree", failing)
    out_dir = tmp_path / "out"
    rc, out, err = cli(str(softmax_project(tmp_path / "a")), "--model", str(model), "-o", str(out_dir))
    assert rc == 1 and "could not finish the model" in err and f"report: {out_dir / 'm.replace.json'}" in err
    report = json.loads(out)
    assert [r["kernel"] for r in report["replaced"]] == ["row_softmax"] and "boom" in report["error"]
    assert sorted(p.name for p in out_dir.iterdir()) == ["m.model.json", "m.replace.json", "m.replace.txt"]
    assert "the build failed" in (out_dir / "m.replace.txt").read_text()
    # compare refuses the folder with a clear error; the next build replaces the report.
    rc, _, cmp_err = run_cli("compare", str(out_dir))
    assert rc == 1 and "failed, so there is no module to run" in cmp_err
    monkeypatch.setattr(pipeline, "_run_iree", real)
    rc, out, err = cli(str(softmax_project(tmp_path / "b")), "--model", str(model), "-o", str(out_dir))
    assert rc == 0, err
    assert "error" not in json.loads((out_dir / "m.replace.json").read_text())


@needs_iree_compile
def test_a_failed_build_never_overwrites_a_users_report(tmp_path):
    model = tmp_path / "m.mlir"
    model.write_text(softmax_model(dtype="f16"))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "m.replace.json").write_text("mine\n")
    rc, out, err = cli(str(softmax_project(tmp_path / "a")), "--no-library", "--model", str(model), "-o", str(out_dir))
    assert rc == 1 and "no op of" in err and "report:" not in err
    assert (out_dir / "m.replace.json").read_text() == "mine\n" and sorted(p.name for p in out_dir.iterdir()) == ["m.replace.json"]
    assert json.loads(out)["replaced"] == []  # --json still prints the decisions


def test_projects_named_by_relative_paths_keep_their_own_sources(tmp_path, monkeypatch):
    """`kitdispatch build kernels/matmul kernels/norm --model M`: the combined module's root is
    the first project's; the second's sources must not be read against it (they were:
    "kernel source kernels/matmul/kernels/norm/norm.cu does not exist")."""
    a = named_project(tmp_path / "a", "mine", KERNEL_TOML.format(src="softmax.cu") + 'replaces = ["linalg.softmax"]\n')
    (a / "softmax.cu").write_bytes(Path(SOFTMAX_CU).read_bytes())
    b = named_project(tmp_path / "b", "mm", library_matmul_toml().replace(f'source = "{MATMUL_CU}"', 'source = "matmul.cu"'))
    (b / "matmul.cu").write_bytes(Path(MATMUL_CU).read_bytes())
    monkeypatch.chdir(tmp_path)
    combined = model_projects([Path("a"), Path("b")], library=False).module
    sources = [combined.source_path(k.source) for k in combined.kernels]
    assert sources == [a.resolve() / "softmax.cu", b.resolve() / "matmul.cu"], sources
