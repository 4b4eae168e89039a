"""pipeline.py: whole model builds with the real iree-compile / iree-opt, their errors, and how
they publish."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import (
    LINALG_MODEL,
    REPO,
    dump_module,
    matmul_model,
    model_project,
    needs_iree_compile,
    softmax_model,
)

from kitdispatch import BuildOptions, IreeCompileError, KitError, ManifestError
from kitdispatch.builder.publish import staging_dir
from kitdispatch.cli import main
from kitdispatch.compile.archs import Arch
from kitdispatch.iree.tools import find_tool, target_flags
from kitdispatch.models.pipeline import ModelBuildFailed, _run_iree, build_model
from kitdispatch.models.spec import SPEC_PIPELINE
from kitdispatch.describe.model_record import read_model_record
from kitdispatch.models.replace import read_ops


@needs_iree_compile
def test_build_replaces_the_matching_softmax_only(linalg_build):
    result, model, out = linalg_build
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["mm_softmax.vmfb", "mm_softmax.baseline.vmfb", "mm_softmax.spec.mlir", "mm_softmax.replace.json",
         "mm_softmax.replace.txt", "mm_softmax.model.json", "softmax.sm_90.fatbin"]
    )
    report = json.loads(result.report.read_text())
    [replaced] = report["replaced"]
    assert replaced["kernel"] == "row_softmax" and replaced["dimension"] == 1
    assert f'"{model}":8:' in replaced["location"] and replaced["inputs"] == [{"dtype": "f32", "shape": [512, 1000]}]
    [kept] = report["not_replaced"]
    assert kept["dimension"] == 0 and "the op normalizes dimension 0, the kernel dimension 1" in kept["reasons"][0]
    text = (out / "mm_softmax.replace.txt").read_text()
    assert "1 of 2 candidate op(s) replaced" in text and "kept" in text


@needs_iree_compile
def test_vmfb_dispatches_the_kernel_instead_of_iree_softmax(linalg_build):
    result, _, _ = linalg_build
    baseline, replaced = dump_module(result.baseline_vmfb), dump_module(result.vmfb)
    assert "row_softmax" in replaced and "row_softmax" not in baseline
    iree_softmax = re.compile(r"dispatch_\d+_softmax")
    # The baseline has IREE's two softmax dispatches; the replaced module keeps only the one
    # the kernel does not fit (dimension 0) and IREE's matmul.
    assert len(set(iree_softmax.findall(result.baseline_vmfb.read_bytes().decode("latin-1")))) == 2
    assert len(set(iree_softmax.findall(result.vmfb.read_bytes().decode("latin-1")))) == 1
    assert re.search(r"dispatch_\d+_matmul", replaced)


@needs_iree_compile
def test_kept_spec_reapplies_with_iree_tools(linalg_build, tmp_path):
    """The kept spec on its own, as its header says to apply it: iree-opt's transform
    interpreter on the marked global-optimization stage, then iree-compile from there."""
    from iree.compiler import ir


    result, model, out = linalg_build
    spec = result.spec.read_text()
    assert "transform.util.cast_and_call" in spec and "util.func private @kitdispatch_row_softmax" in spec
    target = ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_89"]
    stage, marked, replaced, vmfb = (tmp_path / n for n in ("stage.mlir", "marked.mlir", "replaced.mlir", "m.vmfb"))
    subprocess.run([find_tool("iree-compile"), str(model), *target, "--compile-to=global-optimization", "-o", str(stage)],
                   check=True, timeout=300)
    module = ir.Module.parse(stage.read_text(), ir.Context())
    ops = [op for op, facts in read_ops(module, ["linalg.softmax"]) if facts.detail.dimension == 1]
    ops[0].attributes["kitdispatch.replace"] = ir.StringAttr.get("kitdispatch_row_softmax", module.context)
    marked.write_text(str(module))
    subprocess.run([find_tool("iree-opt"), str(marked), f"--pass-pipeline={SPEC_PIPELINE.format(spec=result.spec)}",
                    "-o", str(replaced)], check=True, timeout=300)
    subprocess.run([find_tool("iree-compile"), str(replaced), *target, "--compile-from=global-optimization",
                    f"--iree-hal-executable-object-search-path={out}", "-o", str(vmfb)], check=True, timeout=300)
    assert "row_softmax" in dump_module(vmfb)


@needs_iree_compile
def test_no_match_is_an_error_listing_the_candidates(tmp_path):
    model = tmp_path / "m.mlir"
    model.write_text(softmax_model(dtype="f16"))
    out = tmp_path / "out"
    with pytest.raises(ModelBuildFailed) as err:
        build_model(model_project(tmp_path), model, BuildOptions.create("sm_90"), out, library=False)
    text = err.value.render()
    assert "no op of" in text and "linalg.softmax (512x1000xf16)" in text and "element type" in text
    # Nothing half-written: the report of what was decided, and the record that claims it.
    assert sorted(p.name for p in out.iterdir()) == ["m.model.json", "m.replace.json", "m.replace.txt"]
    assert json.loads((out / "m.replace.json").read_text()) == err.value.report
    assert err.value.report["replaced"] == [] and "element type" in err.value.report["not_replaced"][0]["reasons"][0]
    assert "no op of" in err.value.report["error"] and f"report: {out / 'm.replace.json'}" in text


@needs_iree_compile
def test_model_without_candidates_lists_its_ops(tmp_path):
    model = tmp_path / "m.mlir"
    model.write_text(matmul_model(dtype="f32"))
    with pytest.raises(KitError) as err:
        build_model(model_project(tmp_path), model, BuildOptions.create("sm_90"), tmp_path / "out", library=False)
    assert "has no linalg.softmax" in err.value.render() and "linalg.matmul x1" in err.value.render()


@needs_iree_compile
def test_model_that_does_not_import(tmp_path):
    model = tmp_path / "broken.mlir"
    model.write_text("func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  return %y : tensor<4xf32>\n}\n")
    err = io.StringIO()
    rc = main(["build", str(model_project(tmp_path)), "--model", str(model), "-o", str(tmp_path / "out")], io.StringIO(), err)
    assert rc == 1
    text = err.getvalue()
    assert "could not bring" in text and "re-run: " in text and "use of undeclared SSA value" in text
    assert "Traceback" not in text


def test_unknown_model_format(tmp_path):
    model = tmp_path / "m.pt"
    model.write_bytes(b"x")
    with pytest.raises(KitError) as err:
        build_model(model_project(tmp_path), model, BuildOptions.create("sm_90"), tmp_path / "out")
    assert "export_torch" in err.value.render()


@pytest.mark.parametrize("what", ["missing", "folder", "unknown-format"])
def test_a_model_that_is_not_one_is_bad_input(tmp_path, what):
    """Exit 2 (bad input, as a missing manifest), not 1 (a failed build)."""
    model = {"missing": tmp_path / "none.onnx", "folder": tmp_path, "unknown-format": tmp_path / "m.pt"}[what]
    if what == "unknown-format":
        model.write_bytes(b"x")
    err = io.StringIO()
    code = main(["build", str(model_project(tmp_path)), "--model", str(model), "--arch", "sm_90", "-o", str(tmp_path / "out")], io.StringIO(), err)
    assert code == 2 and "Traceback" not in err.getvalue(), err.getvalue()


def test_project_without_replaces(tmp_path):
    with pytest.raises(ManifestError) as err:
        build_model(model_project(tmp_path, extra=""), tmp_path / "m.mlir", BuildOptions.create("sm_90"), tmp_path / "out")
    assert "declares `replaces`" in err.value.render()


def test_with_baseline_needs_model(tmp_path):
    err = io.StringIO()
    assert main(["build", str(model_project(tmp_path)), "--with-baseline", "-o", str(tmp_path / "o")], io.StringIO(), err) == 2
    assert "--with-baseline needs --model" in err.getvalue() and "usage:" in err.getvalue()
    assert not (tmp_path / "o").exists()


@needs_iree_compile
def test_model_and_output_paths_that_start_with_a_dash(tmp_path, monkeypatch):
    """`--model ./-m.mlir` and `-o=-out`: IREE's tools get them as paths, not as options."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "-m.mlir").write_text(softmax_model())
    stdout, stderr = io.StringIO(), io.StringIO()

    rc = main(["build", str(model_project(tmp_path)), "--model", "./-m.mlir", "--arch", "sm_90", "-o=-out", "--json"], stdout, stderr)
    out, err = stdout.getvalue(), stderr.getvalue()
    assert rc == 0, err
    assert (tmp_path / "-out" / "_m.vmfb").is_file()
    assert json.loads(out)["replaced"][0]["kernel"] == "row_softmax"


@needs_iree_compile
def test_output_folders_with_spaces_quotes_and_commas_build(tmp_path):
    """iree-opt takes the spec's path inside its pass pipeline: quoted there, so that a space,
    a comma or a quote in the output folder's path reaches it whole (they once split the option)."""
    (tmp_path / "m.mlir").write_text(softmax_model())
    out = tmp_path / "my models, \"v2\"" / "out dir"
    stdout, stderr = io.StringIO(), io.StringIO()
    rc = main(["build", str(model_project(tmp_path)), "--model", str(tmp_path / "m.mlir"), "--arch", "sm_90", "-o", str(out)], stdout, stderr)
    assert rc == 0, stderr.getvalue()
    assert (out / "m.vmfb").is_file()


@pytest.mark.parametrize("folder", ["o}b", "o{b"])
def test_an_output_folder_with_braces_is_refused_before_any_work(tmp_path, folder):
    """A brace ends the pass pipeline's option before the quote does: refused up front (exit 2),
    with no folder made, where it once failed in iree-opt after the import and the matching."""
    (tmp_path / "m.mlir").write_text(softmax_model())
    stdout, stderr = io.StringIO(), io.StringIO()
    rc = main(["build", str(model_project(tmp_path)), "--model", str(tmp_path / "m.mlir"), "--arch", "sm_90", "-o", str(tmp_path / folder)],
              stdout, stderr)
    assert rc == 2 and "IREE's pass-pipeline syntax cannot carry" in stderr.getvalue(), stderr.getvalue()
    assert not (tmp_path / folder).exists()


@needs_iree_compile
def test_a_model_build_never_overwrites_a_users_file_and_replaces_its_own(tmp_path):
    """Model builds publish under the same rules as module builds: a file of the user's in the
    way stops the build untouched; the kit's own files of an earlier build are replaced."""
    model = tmp_path / "mm_softmax.mlir"
    model.write_text(LINALG_MODEL)
    project = model_project(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "mm_softmax.spec.mlir").write_text("// my own spec\n")
    with pytest.raises(KitError, match="mm_softmax.spec.mlir exists and was not written by kitdispatch"):
        build_model(project, model, BuildOptions.create("sm_90"), out)
    assert (out / "mm_softmax.spec.mlir").read_text() == "// my own spec\n"
    assert sorted(p.name for p in out.iterdir()) == ["mm_softmax.spec.mlir"]
    (out / "mm_softmax.spec.mlir").unlink()
    first = build_model(project, model, BuildOptions.create("sm_90"), out)
    again = build_model(project, model, BuildOptions.create("sm_90"), out)
    assert again.vmfb == first.vmfb and read_model_record(out)[1].vmfb == "mm_softmax.vmfb"
    # A .vmfb replaced behind the record's back is refused by compare's reader.
    first.vmfb.write_bytes(first.vmfb.read_bytes() + b"\0")
    with pytest.raises(KitError, match="not the file its model record describes"):
        read_model_record(out)


# ------------------------------------------------- the build machinery, shared with module builds


@needs_iree_compile
def test_a_failing_step_keeps_its_inputs_where_the_command_reruns(tmp_path):
    """As a module build's failed link does (builder/publish.py's keep_for_rerun): the staged
    inputs move to a kitdispatch-failed-* folder, the command and log name them there, and the
    output folder keeps nothing of the failed step."""
    out = tmp_path / "out"
    out.mkdir()
    with staging_dir(out) as stage:
        (stage / "m.mlir").write_text("this is not MLIR\n")
        with pytest.raises(IreeCompileError) as err:
            _run_iree([find_tool("iree-opt"), str(stage / "m.mlir"), "-o", str(stage / "o.mlir")], what="iree-opt failed", stage=stage, timeout=120)
    keep = Path(err.value.fix.split("kept in ")[1])
    assert keep.name.startswith("kitdispatch-failed-") and (keep / "m.mlir").read_text() == "this is not MLIR\n"
    assert err.value.argv[1] == str(keep / "m.mlir") and str(stage) not in err.value.log
    assert "the inputs of the failing step (model stages, spec, objects) are kept in" in err.value.render()
    assert list(out.iterdir()) == []
    shutil.rmtree(keep)


def test_one_tool_finder_for_iree_tools():
    """find_tool serves the compiler's tools and the runtime's; a missing one says what to install."""
    with pytest.raises(KitError, match="no-such-iree-tool is not installed"):
        find_tool("no-such-iree-tool")


@needs_iree_compile
def test_model_builds_use_the_target_flags_of_every_iree_compile(linalg_build):
    """IREE's defaults otherwise: the baseline is IREE alone (no link flags of the kit's modules)."""
    _, record = read_model_record(linalg_build[2])
    assert list(record.iree_flags) == target_flags(Arch.parse("sm_89"))


@needs_iree_compile
@pytest.mark.parametrize("tool", ["iree-compile", "iree-opt"])
def test_build_model_timeout_bounds_every_step(tmp_path, tool):
    """A tool of the model's route that never finishes (a stand-in on PATH that sleeps) is
    stopped at --timeout, not at the fixed 600 s: the import to global optimization
    (iree-compile) and the spec's application (iree-opt)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / tool
    stand_in.write_text("#!/bin/sh\nexec sleep 1000\n")
    stand_in.chmod(0o755)
    model = tmp_path / "mm.mlir"
    model.write_text(LINALG_MODEL)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    argv = ["build", model_project(tmp_path), "--model", model, "--arch", "sm_80", "--timeout", "20", "-o", tmp_path / "out"]
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kitdispatch", *map(str, argv)], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1 and f"{tool} did not finish within 20 s and was killed" in proc.stderr, proc.stderr
    assert time.monotonic() - start < 90 and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
    assert subprocess.run(["pgrep", "-f", f"{bin_dir}"], capture_output=True).returncode == 1  # the stand-in is gone
