"""Limits a description is checked against (CUDA's launch limits, sizes, lengths)."""

from __future__ import annotations


MAX_WORKGROUP_THREADS = 1024


MAX_GRID = (2**31 - 1, 65535, 65535)  # CUDA's gridDim limits, x y z


MAX_STATIC_DIM = 2**40  # static tensor dimensions (IREE's index is 64-bit; products must fit)


MAX_EXPRESSION_LENGTH = 1000  # index expressions are short; a longer one is a mistake or an attack


MAX_CONSTANT = 2**64  # u64 values fit; anything larger is a mistake


# The largest per-block opt-in of current GPUs (sm_90: 227 KiB). IREE's CUDA driver sets the
# kernel's MAX_DYNAMIC_SHARED_SIZE_BYTES to the export's value and checks the device's own
# limit when it loads the module (runtime/src/iree/hal/drivers/cuda/native_executable.c).
MAX_DYNAMIC_SHARED_MEMORY = 227 * 1024


# What a block may have at most per compute capability (major * 10 + minor), static and dynamic
# shared memory together, once the kernel opts in (CUDA C++ Programming Guide, "Technical
# Specifications per Compute Capability"). Capabilities missing here are checked at load time.
OPT_IN_SHARED_MEMORY = {
    70: 96 * 1024, 72: 96 * 1024, 75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024, 89: 99 * 1024,
    90: 227 * 1024, 100: 227 * 1024, 103: 227 * 1024, 120: 99 * 1024, 121: 99 * 1024,
}


# What each launch reserves for a dynamic_shared_memory expression unless
# dynamic_shared_memory_max says otherwise: what every CUDA GPU gives a block without opting in.
DEFAULT_DYNAMIC_SHARED_MEMORY_MAX = 48 * 1024


MAX_TIMEOUT_S = 1e7  # a tool's timeout in seconds (about 4 months): beyond it a number is a mistake


# A compile of one source for one target (--timeout changes it). The library's largest sources
# take 280-420 s on two busy cores (kernels/matmul, 440 entries a source): 300 s stopped them.
COMPILE_TIMEOUT_S = 1200.0


IREE_COMPILE_TIMEOUT_S = 600.0  # one iree-compile, iree-opt or importer run
