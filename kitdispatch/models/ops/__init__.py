"""The registry of replaceable op kinds: IREE's op name -> its kind (one module each).

Adding an op kind is adding one module here (its facts, kernel contract, match and call; see
base.py's OpKind), one line below, its name in describe/op_names.py (the manifest's vocabulary,
which describe checks without importing models; tests/models/test_registry.py holds them equal)
and its tests in tests/models/.
"""

from __future__ import annotations

from kitdispatch.models.ops import attention, batch_matmul, generic, layer_norm, matmul, patch_conv, rms_norm, softmax
from kitdispatch.models.ops.base import OpKind

# In the manifest's order (describe/op_names.py): reports and hints list kinds in it.
OP_KINDS: dict[str, OpKind] = {
    kind.name: kind
    for kind in (softmax.KIND, matmul.KIND, batch_matmul.KIND, layer_norm.KIND, rms_norm.KIND, patch_conv.KIND, generic.KIND,
                 attention.KIND)
}
