"""models/advisor.py: what a dispatch computes from IREE's name, its FLOPs and bytes, the GPU's
peaks, and the kit kernel that stands in for it with the saving; `kitdispatch profile` on top.

The dispatch names are real: IREE 3.13's own builds of the HF models in /work/hf/b4 (BERT-base
b8 s512, GPT-2 b1 s128, Llama-style b1 s512, ViT-base b8; `strings NAME.baseline.vmfb`) and the
Nsight Compute kernel names of benchmarks/results/hf-models-h100.json (BERT b8 s512, H100). The
report entries are BERT b8 s512's (/work/hf/b4/bert-f16-b8s512/bert_f16_b8s512.replace.json), cut
to the fields the advisor reads. The GPU test at the end runs `profile` on a built folder."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys

import pytest
from conftest import HAVE_IREE_COMPILE, SAMPLES, needs_iree_compile

from kitdispatch.cli import main
from kitdispatch.describe.model_record import ModelTensor
from kitdispatch.describe.probe_record import TuneEntry, TuneRecord
from kitdispatch.describe.record import DamagedRecord, RecordError
from kitdispatch.models.advisor import (
    PEAKS,
    ReportOp,
    Timed,
    Work,
    achieved,
    advise,
    dispatch_work,
    format_advice,
    parse_dispatch,
    peaks_for,
    report_ops,
    short_reason,
)
from kitdispatch.models.compare import DispatchTime, Profile, format_profile, timed

H100 = peaks_for("NVIDIA H100 80GB HBM3", 90)


def t(text: str) -> ModelTensor:
    *dims, dtype = text.split("x")
    return ModelTensor(dtype, tuple(int(d) for d in dims))


# ------------------------------------------------------------------------ names

# (name, kind, loops, dtypes, consumer): names from the HF builds (module docstring).
REAL_NAMES = [
    ("main_graph_async_dispatch_13_matmul_4096x768x768_f16xf16xf32", "matmul", (4096, 768, 768), ("f16", "f16", "f32"), None),
    ("main_graph$async_dispatch_9_batch_matmul_96x512x512x64_f16xf16xf32", "batch_matmul", (96, 512, 512, 64), ("f16", "f16", "f32"), None),
    ("main_graph_async_dispatch_3_batch_matmul_1x512x5632x2048_f16xf16xf32", "batch_matmul", (1, 512, 5632, 2048), ("f16", "f16", "f32"), None),
    ("main_graph_async_dispatch_10_softmax_8x12x512x512xf32_generic", "softmax", (8, 12, 512, 512), ("f32",), "generic"),
    ("main_graph_async_dispatch_1_elementwise_3145728_f32xf16", "elementwise", (3145728,), ("f32", "f16"), None),
    ("main_graph_async_dispatch_14_elementwise_4096x3072_f16", "elementwise", (4096, 3072), ("f16",), None),
    ("main_graph_async_dispatch_12_elementwise_transpose_8x12x512x64_f32xf16", "elementwise_transpose", (8, 12, 512, 64), ("f32", "f16"), None),
    ("main_graph_async_dispatch_0_elementwise_broadcast_8x512x768_i64xi64xf16xf16", "elementwise_broadcast", (8, 512, 768), ("i64", "i64", "f16", "f16"), None),
    ("main_graph_async_dispatch_2_reduction_4096x768_f32", "reduction", (4096, 768), ("f32",), None),
    ("main_graph_async_dispatch_4_transpose_8x512x12x64_f16", "transpose", (8, 512, 12, 64), ("f16",), None),
    ("main_graph_async_dispatch_2_conv_8x768x14x14x3x16x16_f16xf16xf32", "conv", (8, 768, 14, 14, 3, 16, 16), ("f16", "f16", "f32"), None),
    ("_initializer_2_dispatch_0_elementwise_broadcast_8x512_i64", "elementwise_broadcast", (8, 512), ("i64",), None),
    # iree-compile 3.13 on conftest's LINALG_MODEL: a softmax whose one user is the dispatch's store
    ("forward_dispatch_1_softmax_512x1000xf32_dispatch_tensor_store", "softmax", (512, 1000), ("f32",), None),
    ("forward_dispatch_0_matmul_512x1000x256_f32", "matmul", (512, 1000, 256), ("f32",), None),
    # iree-compile 3.13 on tests/models/test_ops_attention.py's attention_model(batch=8, seq=512, head=64)
    ("forward_dispatch_0_attention_8x512x64x64x512", "attention", (8, 512, 64, 64, 512), (), None),
]


@pytest.mark.parametrize("name, kind, loops, dtypes, consumer", REAL_NAMES)
def test_real_dispatch_names_parse(name, kind, loops, dtypes, consumer):
    op = parse_dispatch(name)
    assert (op.kind, op.loops, op.dtypes, op.consumer) == (kind, loops, dtypes, consumer)


def test_names_without_a_summary_or_not_made_by_iree():
    assert parse_dispatch("main_graph_async_dispatch_7_slow_memcpy").kind == "slow_memcpy"
    assert parse_dispatch("main_graph_async_dispatch_7").kind == "unknown"
    assert parse_dispatch("matmul_nn_f16_f32_none").kind == "unknown"  # a kit export, unnamed as such
    assert parse_dispatch("matmul_nn_f16_f32_none", ["matmul_nn_f16_f32_none"]).kind == "kit kernel"
    dynamic = parse_dispatch("f_dispatch_0_matmul_Dx768x768_f16xf16xf32")
    assert dynamic.loops == (None, 768, 768) and dispatch_work(dynamic) == Work(None, None)
    mmt4d = parse_dispatch("f_dispatch_2_batch_mmt4d_8x16x16x64x16x16x1_f16xf16xf32")
    assert (mmt4d.kind, mmt4d.loops) == ("batch_mmt4d", (8, 16, 16, 64, 16, 16, 1)) and dispatch_work(mmt4d).flops == 2 * 8 * 16 * 16 * 64 * 16 * 16
    assert (parse_dispatch("f_dispatch_4_pack_f32").kind, parse_dispatch("f_dispatch_4_pack_f32").dtypes) == ("pack", ("f32",))
    packed = parse_dispatch("f_dispatch_3_unpack_elementwise_64x64_f32_pack")
    assert (packed.kind, packed.loops, packed.dtypes) == ("elementwise", (64, 64), ("f32",))


# ------------------------------------------------------------------------ work


def test_contraction_flops_and_bytes_from_the_name():
    mm = dispatch_work(parse_dispatch(REAL_NAMES[0][0]))
    assert mm.flops == 2 * 4096 * 768 * 768
    assert mm.bytes == 4096 * 768 * 2 + 768 * 768 * 2 + 4096 * 768 * 4 and mm.bytes_exact
    bmm = dispatch_work(parse_dispatch(REAL_NAMES[1][0]))
    assert bmm.flops == 2 * 96 * 512 * 512 * 64
    assert bmm.bytes == 96 * (512 * 64 * 2 + 64 * 512 * 2 + 512 * 512 * 4)
    conv = dispatch_work(parse_dispatch(REAL_NAMES[10][0]))
    assert conv.flops == 2 * math.prod((8, 768, 14, 14, 3, 16, 16)) and not conv.bytes_exact


@pytest.mark.parametrize("index, moved", [
    (3, 8 * 12 * 512 * 512 * 4),  # softmax then a fused consumer: its input read once
    (12, 512 * 1000 * 4 * 2),  # softmax alone: read and written
    (4, 3145728 * (4 + 2)),  # f32 in, f16 out
    (5, 4096 * 3072 * 2 * 2),  # a collapsed type: one in, one out
    (6, 8 * 12 * 512 * 64 * (4 + 2)),
    (7, 8 * 512 * 768 * 2),  # a broadcast: its output alone
    (8, 4096 * 768 * 4),  # a reduction: its input once
])
def test_memory_bound_dispatches_count_no_flops_and_a_lower_bound_of_bytes(index, moved):
    work = dispatch_work(parse_dispatch(REAL_NAMES[index][0]))
    assert work.flops is None and work.bytes == moved and not work.bytes_exact


def test_report_op_flops_matmul_batch_and_attention():
    assert ReportOp("linalg.matmul", "l", (t("4096x768xf16"), t("768x3072xf16")), t("4096x3072xf32"), "k").flops() == 2 * 4096 * 3072 * 768
    bmm = ReportOp("linalg.batch_matmul", "l", (t("96x512x64xf16"), t("96x64x512xf16")), t("96x512x512xf16"), "k")
    assert bmm.flops() == 2 * 96 * 512 * 512 * 64
    attention = ReportOp("iree_linalg_ext.attention", "l", (t("8x12x512x64xf16"), t("8x12x256x64xf16"), t("8x12x256x64xf16")), t("8x12x512x64xf16"), None)
    assert attention.flops() == 4 * 8 * 12 * 512 * 256 * 64
    norm = ReportOp("layer_norm", "l", (t("8x512x768xf16"), t("768xf16"), t("768xf16")), t("8x512x768xf16"), "layer_norm_f16")
    assert norm.flops() is None and norm.work().bytes == (2 * 8 * 512 * 768 + 2 * 768) * 2 and norm.work().bytes_exact


# ------------------------------------------------------------------------ peaks


@pytest.mark.parametrize("name, capability, gpu", [
    ("NVIDIA H100 80GB HBM3", 90, "H100 SXM"),
    ("NVIDIA H100 PCIe", 90, "H100 PCIe"),
    ("NVIDIA H100 NVL", 90, "H100 NVL"),
    ("NVIDIA H200", 90, "H200 SXM"),
    ("NVIDIA H200 NVL", 90, "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", 80, "A100 SXM4 80GB"),
    ("NVIDIA A100-SXM4-40GB", None, "A100 SXM4 40GB"),
    ("NVIDIA L4", 89, "L4"),
    ("NVIDIA L40S", 89, "L40S"),
    ("NVIDIA A10", 86, "A10"),
    ("NVIDIA A10G", 86, None),  # not the A10's datasheet
    ("NVIDIA GeForce RTX 4090", 89, None),
    ("NVIDIA H100 80GB HBM3", 80, None),  # the name and the capability disagree
    (None, None, None),
])
def test_peaks_by_device_name(name, capability, gpu):
    peaks = peaks_for(name, capability)
    assert (peaks.gpu if peaks else None) == gpu


def test_every_peak_is_dense_and_sane():
    for _, _, p in PEAKS:
        assert p.f16_tflops > p.tf32_tflops > p.f32_tflops > 0 and p.memory_gbps > 0 and p.source
    assert H100.flops_peak("f16") == (989.4, "f16 tensor peak")
    assert H100.flops_peak("f32", "tf32")[0] == 494.7 and H100.flops_peak("f32", "3xtf32")[0] == pytest.approx(494.7 / 3)
    assert H100.flops_peak("f32")[0] == 66.9 and H100.flops_peak("i8") is None


def test_achieved_rate_and_fraction():
    mm = dispatch_work(parse_dispatch(REAL_NAMES[0][0]))
    a = achieved(mm, 10.0, H100, "f16")
    assert a.tflops == pytest.approx(2 * 4096 * 768 * 768 / 10e-6 / 1e12) and a.fraction == pytest.approx(a.tflops / 989.4)
    b = achieved(Work(None, 3.35e9), 1000.0, H100, "f16")  # 3.35 GB in 1 ms: the H100's bandwidth
    assert b.tflops is None and b.gbps == pytest.approx(3350) and b.fraction == pytest.approx(1.0)
    assert achieved(mm, 10.0, None, "f16").fraction is None and achieved(mm, 0.0, H100, "f16").tflops is None
    f32 = Work(2 * 4096**3, None)  # 137 GFLOP
    assert achieved(f32, 4000.0, H100, "f32").of == "f32 peak (CUDA cores)"  # 34 TFLOP/s
    tf32 = achieved(f32, 1000.0, H100, "f32")  # 137 TFLOP/s: more than the CUDA cores give
    assert tf32.of.startswith("TF32 tensor peak") and tf32.fraction == pytest.approx(137.4 / 494.7, rel=1e-3)


# ------------------------------------------------------------------------ pairing and savings

# BERT b8 s512's replaced and kept ops (the report's types), and a softmax it kept.
MM = [ReportOp("linalg.matmul", f"m.mlir:{n}:11", (t("4096x768xf16"), t("768x768xf16")), t("4096x768xf32"), "matmul_nn_f16_f32_none") for n in (69, 73, 76, 88)]
FF = ReportOp("linalg.matmul", "m.mlir:92:11", (t("4096x768xf16"), t("768x3072xf16")), t("4096x3072xf32"), "matmul_nn_f16_f32_none")
LN = ReportOp("layer_norm", "m.mlir:66:11", (t("8x512x768xf16"), t("768xf16"), t("768xf16")), t("8x512x768xf16"), "layer_norm_f16")
SOFTMAX_WHY = "row_softmax: its one reader, linalg.generic {truncf}, is fused by IREE into the softmax's dispatch"
SM = ReportOp("linalg.softmax", "m.mlir:83:11", (t("8x12x512x512xf32"),), t("8x12x512x512xf32"), None, (SOFTMAX_WHY,))
OPS = [*MM, FF, LN, SM]

# Nsight Compute's times a call (us) and launches a call, BERT b8 s512 on the H100.
BASELINE = [
    Timed("main_graph_async_dispatch_3_matmul_4096x768x768_f16xf16xf32", 131.7, 3),
    Timed("main_graph_async_dispatch_13_matmul_4096x768x768_f16xf16xf32", 46.0, 1),
    Timed("main_graph_async_dispatch_16_matmul_4096x3072x768_f16xf16xf32", 155.5, 1),
    Timed("main_graph_async_dispatch_10_softmax_8x12x512x512xf32_generic", 61.5, 1),
    Timed("main_graph_async_dispatch_4_elementwise_transpose_8x512x12x64_f16", 35.0, 2),
    Timed("main_graph_async_dispatch_1_reduction_4096x768_f32", 8.6, 1),
    Timed("main_graph_async_dispatch_2_reduction_4096x768_f32", 8.8, 1),
]
KIT = [
    Timed("matmul_nn_f16_f32_none", 137.9, 5),
    Timed("main_graph_async_dispatch_1_elementwise_3145728_f32xf16", 87.2, 5),
    Timed("main_graph_async_dispatch_7_softmax_8x12x512x512xf32_generic", 61.6, 1),
    Timed("main_graph_async_dispatch_2_elementwise_transpose_8x12x512x64_f16", 35.0, 2),
    Timed("layer_norm_f16", 11.3, 1),
]


def row(rows, name):
    return next(r for r in rows if r.name == name)


def test_pairing_by_kind_and_shape():
    mm = parse_dispatch(BASELINE[0].name)
    assert all(o.matches(mm) for o in MM) and not FF.matches(mm) and not LN.matches(mm)
    assert LN.matches(parse_dispatch(BASELINE[5].name)) and SM.matches(parse_dispatch(BASELINE[3].name))
    # Llama b1 s128's RMSNorm: its reduction and its per-row step, not a row-sized i64 index
    rms = ReportOp("rms_norm", "l", (t("128x2048xf16"), t("2048xf16")), t("128x2048xf16"), "rms_norm_f16")
    assert rms.matches(parse_dispatch("main_graph_async_dispatch_1_reduction_128x2048_f32"))
    assert rms.matches(parse_dispatch("main_graph_async_dispatch_2_elementwise_128_f32"))
    assert not rms.matches(parse_dispatch("_initializer_0_dispatch_0_elementwise_128_i64"))
    batch1 = ReportOp("linalg.batch_matmul", "l", (t("1x128x768xf16"), t("1x768x3072xf16")), t("128x3072xf16"), "k")
    assert batch1.matches(parse_dispatch("main_graph_async_dispatch_5_batch_matmul_1x128x3072x768_f16xf16xf32"))  # BERT b1 s128
    assert not batch1.matches(parse_dispatch("main_graph_async_dispatch_5_batch_matmul_1x128x768x3072_f16xf16xf32"))
    assert not batch1.matches(parse_dispatch("main_graph_async_dispatch_5_batch_matmul_1x128x3072x768_f32"))  # another input type
    attention = ReportOp("iree_linalg_ext.attention", "l", (t("8x512x64xf16"), t("8x512x64xf16"), t("8x512x64xf16")), t("8x512x64xf16"), "k")
    assert attention.matches(parse_dispatch(REAL_NAMES[-1][0]))
    decomposed = ReportOp("iree_linalg_ext.attention", "l", (t("96x512x64xf16"), t("96x512x64xf16"), t("96x512x64xf16")), t("96x512x64xf16"), "k", decomposed=True)
    assert decomposed.matches(parse_dispatch(REAL_NAMES[1][0])) and decomposed.matches(parse_dispatch("f_dispatch_1_batch_matmul_96x512x64x512_f16xf16xf32"))
    assert decomposed.matches(parse_dispatch("f_dispatch_2_softmax_8x12x512x512xf32_generic"))


def test_baseline_profile_names_the_kernel_and_estimates_the_saving_from_the_kit_build():
    rows = advise(BASELINE, OPS, kit_build=False, other=KIT, peaks=H100)
    assert [r.per_call_us for r in rows] == sorted((r.per_call_us for r in rows), reverse=True)
    assert sum(r.share for r in rows) == pytest.approx(1.0)
    qkv = row(rows, BASELINE[0].name)
    # IREE: 177.7 us for the four 4096x768x768 matmuls; the kit's 137.9 us shared by FLOPs.
    kit_share = 137.9 * 4 * (2 * 4096 * 768 * 768) / (4 * 2 * 4096 * 768 * 768 + 2 * 4096 * 3072 * 768)
    assert qkv.stand_in.kernel == "matmul_nn_f16_f32_none" and qkv.stand_in.how == "estimated"
    assert qkv.stand_in.saving_us == pytest.approx(131.7 / 177.7 * (177.7 - kit_share))
    assert qkv.achieved.of == "f16 tensor peak" and 0 < qkv.achieved.fraction <= 1
    ln = row(rows, BASELINE[5].name)  # half of the norm's two reductions
    assert ln.stand_in.kernel == "layer_norm_f16" and ln.stand_in.saving_us == pytest.approx(8.6 / 17.4 * (17.4 - 11.3))
    softmax = row(rows, BASELINE[3].name)
    assert softmax.stand_in is None and softmax.note == f"no kernel stands in: kept: {SOFTMAX_WHY}"
    transpose = row(rows, BASELINE[4].name)
    assert transpose.note == "no kernel stands in: no library kernel takes elementwise transpose 8x512x12x64 f16"
    assert transpose.achieved.of == "memory bandwidth" and not transpose.achieved.bytes_exact


def test_kit_profile_gives_each_kernel_its_ops_and_flags_the_dispatches_new_in_it():
    rows = advise(KIT, OPS, kit_build=True, other=BASELINE, peaks=H100)
    mm = row(rows, "matmul_nn_f16_f32_none")
    assert mm.op.kind == "kit kernel" and mm.what.startswith("4x linalg.matmul (4096x768xf16, 768x768xf16)")
    assert mm.work.flops == 4 * 2 * 4096 * 768 * 768 + 2 * 4096 * 3072 * 768
    assert mm.stand_in.saving_us == pytest.approx(177.7 + 155.5 - 137.9) and mm.stand_in.how == "estimated"
    assert row(rows, "layer_norm_f16").stand_in.saving_us == pytest.approx(17.4 - 11.3)
    assert row(rows, KIT[1].name).note.startswith("not in IREE's own build")
    softmax = row(rows, KIT[2].name)  # numbered differently, the same dispatch: not new
    assert softmax.note == f"no kernel stands in: kept: {SOFTMAX_WHY}" and softmax.stand_in is None


def entry(locations, kernel, kit_us, iree_us, decision, reason="") -> TuneEntry:
    """A tune record's entry as `kitdispatch tune` writes it (describe/probe_record.py)."""
    return TuneEntry("probe_0", "d" * 64, "linalg.matmul", tuple(locations), kernel, kit_us, iree_us, 0.001, "rtol 0.001", True, decision, reason)


def test_measured_savings_from_the_tune_record_win_over_estimates():
    tune = [entry((MM[0].location, MM[1].location), "matmul_nn_f16_f32_none", 20.0, 45.0, "replace"),
            entry((SM.location,), "row_softmax_f32", 70.0, 61.0, "keep", "tune: kit 70.0 us vs IREE 61.0 us"),
            entry((FF.location,), "matmul_nn_f16_f32_none", None, 150.0, "keep", "the kit's probe failed")]
    rows = advise(KIT, OPS, kit_build=True, other=BASELINE, tune=tune, peaks=H100)
    mm = row(rows, "matmul_nn_f16_f32_none")
    assert mm.stand_in.how == "measured and estimated"  # FF's probe has no kit time: FF is estimated
    softmax = row(rows, KIT[2].name)  # tune kept it: the kernel that would stand in costs time
    assert softmax.stand_in.kernel == "row_softmax_f32" and softmax.stand_in.saving_us == pytest.approx(-9.0)
    assert softmax.stand_in.how == "measured" and "tune kept 1" in softmax.stand_in.detail
    assert "costs 9.0 us a call (measured" in "\n".join(format_advice(rows, peaks=H100))
    only_tuned = advise(KIT, MM[:2], kit_build=True, tune=tune[:1], peaks=H100)
    assert row(only_tuned, "matmul_nn_f16_f32_none").stand_in.saving_us == pytest.approx(2 * 25.0)


def test_a_saving_tune_measured_in_the_model_wins_over_its_probes_times():
    """A norm's probe alone: the kit 4.3 us against IREE's 2.5; in the model (its held-out
    build) the model takes 50 us less with the kernel: that saving, per op, is the one shown.
    Probes that share one held-out build share its saving (not each the whole of it)."""
    def norm(probe, locations, heldout="m.heldout_0.vmfb"):
        return TuneEntry(probe, "e" * 64, "layer_norm", locations, "layer_norm_f16", 4.3, 2.5, 0.001, "rtol 0.001", True,
                         "replace", "in the model", model_us=900.0, heldout_us=950.0, heldout=heldout)

    rows = advise(KIT, OPS, kit_build=True, other=BASELINE, tune=[norm("probe_1", (LN.location,))], peaks=H100)
    ln = row(rows, "layer_norm_f16")
    assert ln.stand_in.how == "measured" and ln.stand_in.saving_us == pytest.approx(50.0)
    shared = [norm("probe_1", (LN.location,)), norm("probe_2", ("elsewhere:1:1",)), norm("probe_3", ("elsewhere:2:1",))]
    rows = advise(KIT, OPS, kit_build=True, other=BASELINE, tune=shared, peaks=H100)
    assert row(rows, "layer_norm_f16").stand_in.saving_us == pytest.approx(50.0 / 3)  # one of the three ops held out together
    unnamed = [norm("probe_1", (LN.location,), None), norm("probe_2", ("elsewhere:1:1",), None)]  # a record without the field
    rows = advise(KIT, OPS, kit_build=True, other=BASELINE, tune=unnamed, peaks=H100)
    assert row(rows, "layer_norm_f16").stand_in.saving_us == pytest.approx(25.0)


def test_without_the_other_build_or_a_tune_record_the_saving_is_unknown():
    rows = advise(BASELINE, OPS, kit_build=False, peaks=None)
    qkv = row(rows, BASELINE[0].name)
    assert qkv.stand_in.kernel == "matmul_nn_f16_f32_none" and qkv.stand_in.saving_us is None and qkv.stand_in.how is None
    assert "--with-baseline" in qkv.stand_in.detail and qkv.achieved.fraction is None and qkv.achieved.tflops > 0
    text = "\n".join(format_advice(rows, peaks=None))
    assert "saving unknown" in text and "fractions of peak left out" in text
    assert text.splitlines()[-2].split()[:2] == [f"{sum(r.per_call_us for r in BASELINE):.1f}", "100.0%"]


def test_a_kept_ops_reason_names_one_kernel_of_many():
    many = "matmul_nn_f32_none, matmul_nn_f16_none, bmm_nn_f16_none: the op reads B transposed, W [n,k]"
    assert short_reason(many) == "matmul_nn_f32_none and 2 other kernels: the op reads B transposed, W [n,k]"
    assert short_reason(SOFTMAX_WHY) == SOFTMAX_WHY
    kept = ReportOp("linalg.matmul", "l", (t("4096x768xf16"), t("768x768xf16")), t("4096x768xf32"), None, (many,))
    (r,) = advise([BASELINE[0]], [kept], kit_build=False, peaks=H100)
    assert r.stand_in is None and r.note == "no kernel stands in: kept: " + short_reason(many)
    generic = ReportOp("linalg.generic", "l", (t("3145728xf32"),), t("3145728xf16"), None, ("bias_gelu: not the pattern",))
    (r,) = advise([Timed("f_dispatch_1_elementwise_3145728_f32xf16", 80.0, 1)], [generic], kit_build=False, peaks=H100)
    assert r.note == "no kernel stands in: no library kernel takes elementwise 3145728 f32xf16"  # a pattern's mismatch is no reason


@pytest.mark.parametrize("inputs, result", [((), "4x4xf16"), (("4xf16",), "4xf16"), (("4x4xf16", "4x4xf16"), "f16"), (("?x4xf16", "4x4xf16"), "4x4xf32")])
def test_odd_report_entries_pair_with_nothing_and_count_no_flops(inputs, result):
    def tensor(text):
        *dims, dtype = text.split("x")
        return ModelTensor(dtype, tuple(None if d == "?" else int(d) for d in dims))

    for kind in ("linalg.matmul", "linalg.batch_matmul", "iree_linalg_ext.attention", "layer_norm", "linalg.softmax"):
        op = ReportOp(kind, "l", tuple(tensor(i) for i in inputs), tensor(result), "k")
        assert op.flops() is None
        assert not any(op.matches(parse_dispatch(name)) for name, *_ in REAL_NAMES)


def test_report_ops_read_from_a_record_entry():
    entry = {"op": "linalg.matmul", "location": "x:1:1", "inputs": [{"dtype": "f16", "shape": [4096, 768]}, {"dtype": "f16", "shape": [768, 768]}],
             "result": {"dtype": "f32", "shape": [4096, 768]}, "kernel_entry": "k", "arithmetic": "tf32"}

    class Record:  # the two fields report_ops reads
        replaced = (type("R", (), {"entry": entry})(),)
        not_replaced = ({"op": "linalg.softmax", "inputs": "damaged", "result": {}}, {**entry, "reasons": ["why"]})

    ops = report_ops(Record())
    assert [(o.kernel_entry, o.reasons, o.arithmetic) for o in ops] == [("k", (), "tf32"), (None, ("why",), "tf32")]


def _exports(vmfb) -> list[str]:
    """The dispatch names a compiled module holds, as Nsight Compute reports them (`$` -> `_`)."""
    import re

    text = vmfb.read_bytes().decode("latin-1").replace("$", "_")
    return sorted(set(re.findall(r"forward_dispatch_\d+_[A-Za-z0-9_]+?(?=_param_|\x00|$)", text)) - {""})


@needs_iree_compile
def test_real_builds_pair_their_dispatches_through_the_record(linalg_build):
    """The kit's build of a matmul + two softmaxes (the project's row_softmax replaces the one
    over the last dim) and IREE's own, compiled by iree-compile here: the dispatch names in the
    modules and the ops in the record pair up. Times are made up (no GPU): 10 us each."""
    from kitdispatch.describe.model_record import read_model_record

    _, _, out = linalg_build
    folder, record = read_model_record(out)
    ops = report_ops(record)
    baseline = [Timed(n, 10.0, 1.0) for n in _exports(folder / record.baseline_vmfb)]
    kit = [Timed(n, 10.0, 1.0) for n in _exports(folder / record.vmfb)] + [Timed("row_softmax", 4.0, 1.0)]
    softmaxes = [r.name for r in baseline if parse_dispatch(r.name).kind == "softmax"]
    assert softmaxes and any(parse_dispatch(r.name).kind == "matmul" for r in baseline), [r.name for r in baseline]
    rows = advise(baseline, ops, kit_build=False, other=kit, peaks=H100)
    standing = [r for r in rows if r.stand_in is not None]
    assert [r.name for r in standing] == [n for n in softmaxes if "512x1000" in n]
    assert standing[0].stand_in.kernel == "row_softmax" and standing[0].stand_in.saving_us == pytest.approx(6.0)
    kit_rows = advise(kit, ops, kit_build=True, other=baseline, peaks=H100)
    assert row(kit_rows, "row_softmax").what == "linalg.softmax (512x1000xf32) -> 512x1000xf32"
    assert row(kit_rows, "row_softmax").achieved.gbps == pytest.approx(2 * 512 * 1000 * 4 / 4e-6 / 1e9)


# ------------------------------------------------------------------------ the tune record


def _tune_folder(tmp_path, probes_sha256: str) -> tuple:
    """A model folder's record listing its probe record (by hash), and a tune record beside it."""
    from kitdispatch.describe.model_record import ModelRecord

    record = ModelRecord("t", "m.onnx", "", "m.vmfb", None, "", (), "", "", (), (), (), (), (), (),
                         {"m.vmfb": "0" * 64, "m.probes.json": "a" * 64})
    tuned = TuneRecord("m", "m.onnx", "b" * 64, probes_sha256, "main", "cuda", "device time", "random",
                       (entry(["m.mlir:69:11"], "matmul_nn_f16_f32_none", 20.5, 44.0, "replace"),))
    (tmp_path / "m.tune.json").write_bytes(tuned.to_bytes())
    return record, tuned


def test_the_tune_record_of_this_build_is_read(tmp_path):
    from kitdispatch.models.compare import tune_of

    record, tuned = _tune_folder(tmp_path, "a" * 64)
    assert tune_of(tmp_path, record) == (tuned.entries, None)
    (tmp_path / "m.tune.json").unlink()
    entries, note = tune_of(tmp_path, record)
    assert entries is None and note.startswith("no m.tune.json (`kitdispatch tune DIR` writes it)")


def test_a_tune_record_of_another_builds_probes_is_not_used(tmp_path):
    from kitdispatch.models.compare import tune_of

    record, _ = _tune_folder(tmp_path, "c" * 64)
    entries, note = tune_of(tmp_path, record)
    assert entries is None and "measured on another build's probes" in note


def test_a_damaged_tune_record_is_refused(tmp_path):
    from kitdispatch.models.compare import tune_of

    record, _ = _tune_folder(tmp_path, "a" * 64)
    data = json.loads((tmp_path / "m.tune.json").read_text())
    for key in ("kit_us", "heldout_us"):
        damaged = json.loads(json.dumps(data))
        damaged["probes"][0][key] = "20"
        (tmp_path / "m.tune.json").write_text(json.dumps(damaged))
        with pytest.raises(DamagedRecord, match="a time or error"):
            tune_of(tmp_path, record)
    (tmp_path / "m.tune.json").unlink()
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "m.tune.json").symlink_to(tmp_path / "real.json")
    with pytest.raises(RecordError, match="symbolic link"):
        tune_of(tmp_path, record)


# ------------------------------------------------------------------------ the command


def test_profile_text_and_json_carry_the_same_rows():
    times = tuple(DispatchTime(r.name, 5 * int(r.launches_per_call), r.per_call_us / r.launches_per_call, 5 * r.per_call_us,
                               r.per_call_us / r.launches_per_call, r.per_call_us) for r in BASELINE)
    assert [timed(d) for d in times] == BASELINE
    rows = advise([timed(d) for d in times], OPS, kit_build=False, other=KIT, peaks=H100)
    profile = Profile("m.baseline.vmfb", "baseline", "NVIDIA H100 80GB HBM3", H100, times, rows, other_total_us=332.0)
    data = profile.to_json()
    assert [d["name"] for d in data["dispatches"]] == [r.name for r in rows]
    assert all(d["median_us"] > 0 and d["share"] > 0 for d in data["dispatches"]) and data["total_us"] == pytest.approx(sum(r.per_call_us for r in BASELINE))
    assert data["dispatches"][0]["stand_in"]["how"] == "estimated" and data["peaks"]["gpu"] == "H100 SXM"
    text = format_profile(profile)
    assert "(IREE's own build)" in text and "332.0 us a call in the kit's build" in text
    assert all(r.name in text for r in rows)


def test_the_device_a_uri_names(monkeypatch):
    from kitdispatch.models import compare
    from kitdispatch.run.cuda_driver import CudaDevice, DriverInfo

    devices = (CudaDevice(0, "NVIDIA H100 80GB HBM3", 90), CudaDevice(1, "NVIDIA L4", 89))
    monkeypatch.setattr(compare, "driver_info", lambda: DriverInfo("13.0", devices))
    assert compare.cuda_device("cuda") == devices[0] and compare.cuda_device("cuda://1") == devices[1]
    assert compare.cuda_device("cuda://7") is None
    monkeypatch.setattr(compare, "driver_info", lambda: None)
    assert compare.cuda_device("cuda") is None


@needs_iree_compile
def test_profile_baseline_of_a_folder_without_one_is_refused(tmp_path_factory):
    from conftest import cpu_model_build, make_embedding_model

    tmp = tmp_path_factory.mktemp("nobase")
    make_embedding_model(tmp / "m.onnx")
    out = cpu_model_build(tmp / "m.onnx", tmp / "out", baseline=False)
    err = io.StringIO()
    assert main(["profile", str(out), "--baseline"], io.StringIO(), err) == 2
    assert "has no baseline module" in err.getvalue() and "--with-baseline" in err.getvalue()


# ------------------------------------------------------------------------ on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("baseline", [False, True])
def test_profile_columns_are_consistent_on_gpu(tmp_path, prebuilt_dir, baseline):
    """`profile` of the ONNX softmax sample's build (the library's matmul and softmax replace its
    ops): every dispatch took time, shares add up to one, no rate beyond its peak (5% for clocks
    above the datasheet's boost), and the text and --json give the same dispatches."""
    from kitdispatch import BuildOptions
    from kitdispatch.models.pipeline import build_model

    built = prebuilt_dir / "onnx_softmax_model" if prebuilt_dir else None
    if built is None:
        if not HAVE_IREE_COMPILE:
            pytest.skip("iree-compile is not installed")
        pytest.importorskip("onnx")
        model = tmp_path / "model.onnx"
        subprocess.run([sys.executable, str(SAMPLES / "onnx_softmax" / "make_model.py"), str(model)], check=True, timeout=120)
        built = build_model(SAMPLES / "onnx_softmax", model, BuildOptions.create("sm_90"), tmp_path / "out", with_baseline=True).out_dir
    out, err = io.StringIO(), io.StringIO()
    argv = ["profile", str(built), "--json"] + (["--baseline"] if baseline else [])
    assert main(argv, out, err) == 0, err.getvalue()
    data = json.loads(out.getvalue())
    rows = data["dispatches"]
    assert rows and data["build"] == ("baseline" if baseline else "kit")
    assert all(r["per_call_us"] > 0 and r["median_us"] > 0 for r in rows)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert all(r["achieved"]["fraction"] is None or 0 < r["achieved"]["fraction"] <= 1.05 for r in rows)
    assert data["other_total_us"] is not None and data["other_total_us"] > 0  # the folder has both builds: the other one was profiled
    if data["peaks"] is not None:
        assert any(r["achieved"]["fraction"] is not None for r in rows)
    if not baseline:
        assert any(r["op"]["kind"] == "kit kernel" and r["stand_in"]["how"] in ("estimated", "measured") for r in rows)
    text = io.StringIO()
    assert main([a for a in argv if a != "--json"], text, io.StringIO()) == 0
    assert all(r["name"] in text.getvalue() for r in rows) and "total device time a call" in text.getvalue()


@pytest.mark.gpu
def test_profile_after_tune_gives_measured_savings_on_gpu(tmp_path):
    """A build with probes and IREE's own, tuned on the GPU: `profile` reads the tune record and
    gives the kit kernels' savings as measured (the model of tests/models/test_tune.py)."""
    from kitdispatch import BuildOptions
    from kitdispatch.models.compare import profile_module
    from kitdispatch.models.pipeline import build_model
    from kitdispatch.models.tune import tune_model
    from models.test_tune import make_model

    if not HAVE_IREE_COMPILE:
        pytest.skip("iree-compile is not installed")
    pytest.importorskip("onnx")
    model = tmp_path / "m.onnx"
    make_model(model)
    out = build_model(None, model, BuildOptions.create("sm_90"), tmp_path / "out", probes=True, with_baseline=True).out_dir
    tune_model(out)
    profile = profile_module(out)
    assert profile.tune == "m.tune.json" and not any("m.tune.json" in n for n in profile.notes), profile.notes
    kit = [a for a in profile.advice if a.op.kind == "kit kernel"]
    assert kit and any("measured" in (a.stand_in.how or "") for a in kit), [a.stand_in for a in kit]
    assert all(a.per_call_us > 0 for a in profile.advice)
