"""layer_norm: a LayerNorm over the last dim as IREE brings it to global optimization (a mean
and a variance reduction, the generic that ends the norm; norm.py reads the chain), with
weight and bias, weight only, bias only (a weight of ones folded away), or neither."""

from __future__ import annotations

from kitdispatch.models.ops.norm import Norm

KIND = Norm("layer_norm", ("weight", "bias"))
