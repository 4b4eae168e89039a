"""Writes a transformer's input stage as ONNX, the way exporters write it: token ids and
position ids (int64) each index an embedding table (Gather), the two rows are added, an int64
attention mask (cast to float) scales them, and a Softmax over the hidden size ends it (an op
the library replaces, so that the model builds).

    python tests/data/embedding/make_model.py OUT.onnx [--tokens 8 --vocab 50 --positions 12 --hidden 64]
        [--shifted]    # the token table is indexed by ids + shift, a second int64 input
        [--dynamic]    # the number of tokens is a dynamic size ("n")

Also written by `make_model` for the tests (tests/run/test_model.py, tests/models/test_functions.py).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def make_model(
    tokens: int = 8, vocab: int = 50, positions: int = 12, hidden: int = 64, *, shifted: bool = False, dynamic: bool = False, seed: int = 0,
) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "tokens_table"),
        numpy_helper.from_array(rng.standard_normal((positions, hidden)).astype(np.float32), "positions_table"),
        numpy_helper.from_array(np.array([1], np.int64), "hidden_axis"),
    ]
    node = helper.make_node
    index = "ids"
    nodes = []
    if shifted:  # an index that two inputs make: no one input's range follows from the table
        nodes.append(node("Add", ["ids", "shift"], ["shifted_ids"]))
        index = "shifted_ids"
    nodes += [
        node("Gather", ["tokens_table", index], ["token_rows"], axis=0),
        node("Gather", ["positions_table", "position_ids"], ["position_rows"], axis=0),
        node("Add", ["token_rows", "position_rows"], ["rows"]),
        node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
        node("Unsqueeze", ["mask_f", "hidden_axis"], ["mask_col"]),
        node("Mul", ["rows", "mask_col"], ["masked"]),
        node("Softmax", ["masked"], ["y"], axis=-1),
    ]
    length = "n" if dynamic else tokens
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, [length]) for n in ("ids", "position_ids", "mask")]
    if shifted:
        ids.append(helper.make_tensor_value_info("shift", TensorProto.INT64, [length]))
    graph = helper.make_graph(nodes, "embed", ids, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [length, hidden])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def reference(model: onnx.ModelProto, ids: np.ndarray, position_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """What the model computes, in numpy (unshifted models)."""
    tables = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    rows = (tables["tokens_table"][ids] + tables["positions_table"][position_ids]) * mask.astype(np.float32)[:, None]
    e = np.exp(rows - rows.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=50)
    parser.add_argument("--positions", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--shifted", action="store_true")
    parser.add_argument("--dynamic", action="store_true")
    args = parser.parse_args()
    onnx.save(make_model(args.tokens, args.vocab, args.positions, args.hidden, shifted=args.shifted, dynamic=args.dynamic), args.out)


if __name__ == "__main__":
    main()
