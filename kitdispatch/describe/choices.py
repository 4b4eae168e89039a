"""A build's closed choices (object format, compiler) and their defaults; each is a string where
one is written (manifests, flags, records)."""

from __future__ import annotations

import enum


class ObjectFormat(str, enum.Enum):
    """PTX (JIT-compiled by the driver), cubin (SASS for one architecture) or fatbin (SASS per
    architecture plus PTX for newer GPUs: the default)."""

    PTX = "ptx"
    CUBIN = "cubin"
    FATBIN = "fatbin"

    def __str__(self) -> str:  # as manifests, flags and records write it
        return self.value

    @classmethod
    def choices(cls) -> tuple[str, ...]:
        return tuple(f.value for f in cls)


DEFAULT_FORMAT = ObjectFormat.FATBIN


class CompilerName(str, enum.Enum):
    """The CUDA compilers a build can use: NVRTC from pip (the default) or a CUDA toolkit's nvcc."""

    NVRTC = "nvrtc"
    NVCC = "nvcc"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def choices(cls) -> tuple[str, ...]:
        return tuple(c.value for c in cls)


DEFAULT_COMPILER = CompilerName.NVRTC

# What `--arch` means when it is not given: the oldest GPU generation with the tensor cores and
# asynchronous copies the kit's library uses.
DEFAULT_ARCHS = "sm_80"
