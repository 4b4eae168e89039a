"""rms_norm: an RMSNorm over the last dim as IREE brings it to global optimization (a mean of
squares, computed in f32 and cast back in an f16 model; norm.py reads the chain), with a
weight or without."""

from __future__ import annotations

from kitdispatch.models.ops.norm import Norm

KIND = Norm("rms_norm", ("weight",))
