"""Which PTX instructions each GPU architecture runs, checked per target at build time.

PTX for an architecture that lacks an instruction compiles without a word (NVRTC and
`nvcc -ptx` do not assemble it) and fails only when the driver JIT-compiles it on the GPU:
the library's matmul (cp.async, ldmatrix, mma.sync.m16n8k16) built as PTX for sm_70 would
fail at load on a V100. So the build reads every PTX it made, instruction by instruction
(the PTX says what will run; the C source, with its `#if __CUDA_ARCH__` branches and
headers, does not), and refuses an architecture that lacks one, naming the instruction,
the kernel and the source line.

The table was measured with ptxas 12.9 (nvidia-cuda-nvcc-cu12; sm_50 to sm_121a) and 13.0
(sm_75 to sm_121f) on one example instruction per row; tests/compile/test_toolchain.py checks every
example against each ptxas it finds, for every target that ptxas knows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kitdispatch.compile.archs import Arch
from kitdispatch.errors import ArchError

# Capabilities whose arch- or family-specific targets (sm_90a, sm_100f, ...) have a feature
# (sm_110 is Thor, sm_101 before CUDA 13).
_SPECIFIC_FROM_HOPPER = (90, 100, 101, 103, 110, 120, 121)
_SPECIFIC_FROM_BLACKWELL = (100, 101, 103, 110, 120, 121)
_BLACKWELL_TENSOR_CORES = (100, 101, 103, 110)


@dataclass(frozen=True)
class Feature:
    """An instruction (or a family of them) and the targets that run it."""

    name: str
    pattern: str  # a regex searched in one instruction statement, from its opcode on
    minimum: str  # the oldest architecture with it
    example: str  # one instruction it matches, assembled by the tests for every target
    # Capabilities whose arch- or family-specific targets (sm_90a, sm_100f) have it; None:
    # every target from `minimum` on has it.
    specific_to: tuple[int, ...] | None = None

    def runs_on(self, arch: Arch) -> bool:
        if arch.capability < Arch.parse(self.minimum).capability:
            return False
        return self.specific_to is None or (arch.suffix in ("a", "f") and arch.capability in self.specific_to)

    @property
    def requirement(self) -> str:
        if self.specific_to is None:
            return f"{self.minimum} or newer"
        return "an arch-specific target: " + ", ".join(f"sm_{c}a" for c in self.specific_to)


FEATURES = (
    # Memory movement
    Feature("cp.async (asynchronous copy to shared memory)", r"^cp\.async\.(?!bulk)", "sm_80",
       "cp.async.cg.shared.global [%r1], [%rd2], 16;"),
    Feature("cp.async.bulk (TMA bulk copies)", r"^cp\.(reduce\.)?async\.bulk", "sm_90",
       "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd2], 16, [%r2];"),
    Feature("ldmatrix", r"^ldmatrix\.", "sm_75", "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1,%r2,%r3,%r4}, [%r5];"),
    Feature("movmatrix", r"^movmatrix\.", "sm_75", "movmatrix.sync.aligned.m8n8.trans.b16 %r1, %r2;"),
    Feature("stmatrix", r"^stmatrix\.", "sm_90", "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%r5], {%r1,%r2,%r3,%r4};"),
    Feature("st.async", r"^st\.async\b", "sm_90",
       "st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%r1], %r2, [%r3];"),
    Feature("L2 cache hints and eviction policies", r"^(createpolicy|discard|applypriority)\.|\.L2::(cache_hint|evict_\w+|256B)\b",
       "sm_80", "ld.global.L2::cache_hint.b32 %r1, [%rd2], %rd3;"),
    Feature("L2 prefetch size", r"\.L2::(64|128)B\b", "sm_75", "ld.global.L2::128B.b32 %r1, [%rd2];"),
    # Tensor cores
    Feature("mma.sync m8n8k4 (f16)", r"^mma\.sync\.aligned\.m8n8k4\.(?!.*\.f64\b)", "sm_70",
       "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%f0,%f1,%f2,%f3,%f4,%f5,%f6,%f7}, {%r1,%r2}, {%r3,%r4}, {%f8,%f9,%f10,%f11,%f12,%f13,%f14,%f15};"),
    Feature("mma.sync m16n8k8 (f16)", r"^mma\.sync\.aligned\.m16n8k8\.(?!.*\.(bf16|tf32)\b)", "sm_75",
       "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%f0,%f1,%f2,%f3}, {%r1,%r2}, {%r3}, {%f4,%f5,%f6,%f7};"),
    Feature("mma.sync m8n8k16/m8n8k32 (integer)", r"^mma\.sync\.aligned\.m8n8k(16|32|128)\.", "sm_75",
       "mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%r1,%r2}, {%r3}, {%r4}, {%r5,%r6};"),
    Feature("mma.sync m16n8k16 and larger shapes", r"^mma\.sync\.aligned\.m16n8k(16|32|64|128|256)\.", "sm_80",
       "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f0,%f1,%f2,%f3}, {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%f4,%f5,%f6,%f7};"),
    Feature("mma.sync with bf16 or tf32", r"^mma\.sync\..*\.(bf16|tf32)\b", "sm_80",
       "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%f0,%f1,%f2,%f3}, {%r1,%r2}, {%r3}, {%f4,%f5,%f6,%f7};"),
    Feature("mma.sync f64", r"^mma\.sync\..*\.f64\b", "sm_80",
       "mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%fd0,%fd1}, {%fd2}, {%fd3}, {%fd4,%fd5};"),
    Feature("mma.sync with fp8 (e4m3, e5m2)", r"^mma\.sync\..*\.(e4m3|e5m2)\b", "sm_89",
       "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%f0,%f1,%f2,%f3}, {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%f4,%f5,%f6,%f7};"),
    Feature("mma.sp (sparse tensor cores)", r"^mma\.sp", "sm_80",
       "mma.sp.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f0,%f1,%f2,%f3}, {%r1,%r2}, {%r3,%r4}, {%f4,%f5,%f6,%f7}, %r9, 0x0;"),
    Feature("wmma (f16)", r"^wmma\.", "sm_70",
       "wmma.load.a.sync.aligned.row.m16n16k16.global.f16 {%r1,%r2,%r3,%r4,%r5,%r6,%r7,%r8}, [%rd2];"),
    Feature("wmma with s8/u8", r"^wmma\..*\.[su]8\b", "sm_72", "wmma.load.a.sync.aligned.row.m16n16k16.global.s8 {%r1,%r2}, [%rd2];"),
    Feature("wmma with s4/u4/b1", r"^wmma\..*\.([su]4|b1)\b", "sm_75", "wmma.load.a.sync.aligned.row.m8n8k32.global.s4 {%r1}, [%rd2];"),
    Feature("wmma with bf16, tf32 or f64", r"^wmma\..*\.(bf16|tf32|f64)\b", "sm_80",
       "wmma.load.a.sync.aligned.row.m16n16k16.global.bf16 {%r1,%r2,%r3,%r4}, [%rd2];"),
    Feature("wgmma (Hopper warpgroup MMA)", r"^wgmma\.", "sm_90", "wgmma.fence.sync.aligned;", (90,)),
    Feature("tcgen05 (Blackwell tensor cores)", r"^tcgen05\.", "sm_100", "tcgen05.fence::before_thread_sync;",
       _BLACKWELL_TENSOR_CORES),
    Feature("setmaxnreg", r"^setmaxnreg\.", "sm_90", "setmaxnreg.inc.sync.aligned.u32 240;", _SPECIFIC_FROM_HOPPER),
    # Number formats
    Feature("bf16 and tf32 conversions, f16x2 packing, relu conversions", r"^cvt\..*\.(bf16|bf16x2|tf32|f16x2\.f32)\b|^cvt\.\w+\.relu\.",
       "sm_80", "cvt.rn.bf16.f32 %h1, %f1;"),
    Feature("bf16 fma, min, max, neg, abs; f16 min, max", r"^(fma|min|max|neg|abs)\..*\bbf16(x2)?\b|^(min|max)(\.\w+)*\.f16(x2)?\b",
       "sm_80", "fma.rn.bf16 %h1, %h2, %h3, %h4;"),
    Feature("bf16 add, sub, mul and math", r"^(add|sub|mul|ex2|tanh)\..*\bbf16(x2)?\b", "sm_90", "add.rn.bf16 %h1, %h2, %h3;"),
    Feature("fp8 conversions (e4m3, e5m2)", r"^cvt\..*\.(e4m3x2|e5m2x2)\b", "sm_89", "cvt.rn.satfinite.e4m3x2.f32 %h1, %f1, %f2;"),
    Feature("fp4/fp6 conversions", r"^cvt\..*\.(e2m1x2|e2m3x2|e3m2x2|ue8m0x2)\b", "sm_100",
       "cvt.rn.satfinite.e2m1x2.f32 %b1, %f1, %f2;", _SPECIFIC_FROM_BLACKWELL),
    Feature("tanh.approx, ex2.approx.f16", r"^tanh\.approx\.f32|^ex2\.approx(\.\w+)*\.f16", "sm_75", "tanh.approx.f32 %f1, %f2;"),
    Feature("bf16 atomics", r"^(atom|red)\..*\.bf16(x2)?\b", "sm_90", "atom.global.add.noftz.bf16 %h1, [%rd2], %h2;"),
    # Synchronization and thread block clusters
    Feature("redux.sync", r"^redux\.sync", "sm_80", "redux.sync.add.s32 %r1, %r2, 0xffffffff;"),
    Feature("mbarrier", r"^mbarrier\.", "sm_80", "mbarrier.init.shared.b64 [%r1], 1;"),
    Feature("mbarrier try_wait and transaction counts", r"^mbarrier\.(try_wait|.*expect_tx|.*complete_tx)", "sm_90",
       "mbarrier.try_wait.shared.b64 %p1, [%r1], %rd3;"),
    Feature("thread block clusters", r"^(barrier\.cluster|mapa|getctarank)\b|\.shared::cluster\b|%(cluster_\w+|clusterid|nclusterid|is_explicit_cluster)\b",
       "sm_90", "barrier.cluster.arrive;"),
    Feature("elect.sync", r"^elect\.sync", "sm_90", "elect.sync %r1|%p1, 0xffffffff;"),
    Feature("async proxy fences", r"^fence\.proxy\.(async|tensormap)", "sm_90", "fence.proxy.async;"),
    Feature("griddepcontrol (programmatic dependent launch)", r"^griddepcontrol\.", "sm_90", "griddepcontrol.wait;"),
    Feature("multimem", r"^multimem\.", "sm_90", "multimem.ld_reduce.relaxed.sys.global.add.f32 %f1, [%rd2];"),
)

_TARGET_RE = re.compile(r"^\s*\.target\s+(sm_\d+[af]?)", re.M)
_ENTRY_RE = re.compile(r"\.entry\s+([\w$.]+)")
_FILE_RE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', re.M)
_LOC_RE = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+\d+(?:.*inlined_at\s+(\d+)\s+(\d+))?")


@dataclass(frozen=True)
class UnsupportedInstruction:
    feature: Feature
    arch: Arch
    instruction: str
    ptx_line: int
    entry: str | None
    source_line: str | None  # "k.cu:34" (called from "k.cu:92"), where the PTX has .loc lines


def ptx_target(ptx: str) -> Arch | None:
    m = _TARGET_RE.search(ptx)
    return Arch.parse(m.group(1)) if m else None


def find_unsupported(ptx: str, arch: Arch | None = None) -> UnsupportedInstruction | None:
    """The first instruction of `ptx` that `arch` (default: the PTX's .target) cannot run."""
    arch = arch or ptx_target(ptx)
    if arch is None:
        return None
    missing = [f for f in FEATURES if not f.runs_on(arch)]
    if not missing:
        return None
    compiled = [(f, re.compile(f.pattern)) for f in missing]
    files = {m.group(1): m.group(2) for m in _FILE_RE.finditer(ptx)}  # listed after the code
    entry, loc = None, None
    for number, line in enumerate(ptx.splitlines(), 1):
        code = line.split("//", 1)[0]
        if (m := _ENTRY_RE.search(code)) is not None:
            entry = m.group(1)
        if (m := _LOC_RE.match(code)) is not None:
            loc = m
        for statement in _statements(code):
            for feature, pattern in compiled:
                if pattern.search(statement):
                    return UnsupportedInstruction(feature, arch, statement, number, entry, _source_line(loc, files))
    return None


def _statements(code: str) -> Iterable[str]:
    """The instructions on one line of PTX, without predicates; no directives or labels."""
    for part in code.split(";"):
        text = re.sub(r"^[\s{}]*(@!?%\w+\s+)?", "", part).strip()
        if text and not text.startswith(".") and not text.endswith(":"):
            yield text + ";"


def _source_line(loc: re.Match | None, files: dict[str, str]) -> str | None:
    if loc is None or loc.group(1) not in files:
        return None
    where = f"{files[loc.group(1)]}:{loc.group(2)}"
    if loc.group(3) in files:
        where += f" (called from {Path(files[loc.group(3)]).name}:{loc.group(4)})"
    return where


def check_arch_features(objects: Iterable, compile_with_lines: Callable[[Path, Arch], bytes] | None = None) -> None:
    """Refuses a build whose PTX (objects of format ptx, and the PTX behind cubins and
    fatbins) uses an instruction its target architecture lacks. `compile_with_lines(source,
    arch)` recompiles a source to PTX with -lineinfo, so the error can name the source line;
    it runs only when an instruction is refused."""
    for obj in objects:
        ptx = obj.data if obj.format == "ptx" else obj.ptx
        if not ptx:
            continue  # nvcc's cubins and fatbins: ptxas has assembled them for their targets already
        text = ptx.decode(errors="replace")
        problem = find_unsupported(text)
        if problem is None:
            continue
        if problem.source_line is None and compile_with_lines is not None:
            problem = find_unsupported(compile_with_lines(obj.source, problem.arch).decode(errors="replace")) or problem
        raise _refusal(obj.source, problem)


def _refusal(source: Path, problem: UnsupportedInstruction) -> ArchError:
    arch = problem.arch.name
    kernel = f"kernel {problem.entry} in " if problem.entry else ""
    return ArchError(
        f"{kernel}{source.name} uses {problem.feature.name}, which needs {problem.feature.requirement}, "
        f"so it cannot run on {arch}: `{problem.instruction}` (line {problem.ptx_line} of its PTX for {arch})",
        where=problem.source_line or str(source),
        fix=f"leave {arch} out of --arch, or give {arch} another code path "
        f"(#if __CUDA_ARCH__ < {Arch.parse(problem.feature.minimum).capability * 10} ... #endif)",
    )
