"""GPT-2 (HF export, 1 layer as /work/hf/y*) rebuilt with the packed-QKV attention: outputs against
IREE alone and per-dispatch device time (Nsight Compute) of both modules."""
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # benchmarks/
from hf_models import NAME_RE, draw_parameters, model_inputs  # noqa: E402

from kitdispatch.models.compare import compare_model  # noqa: E402

for name in sys.argv[2:]:
    root = Path(sys.argv[1])
    m = NAME_RE.match(name)
    with tempfile.TemporaryDirectory() as tmp:
        irpa, inputs = Path(tmp) / "w.irpa", Path(tmp) / "in.npz"
        draw_parameters(root / f"{name}.params.npz", irpa)
        np.savez(inputs, *model_inputs(m["model"], int(m["batch"]), int(m["seq"]), m["dtype"]))
        c = compare_model(root / name, inputs=inputs, parameters=irpa, repetitions=20)
    j = c.to_json()
    print(name, "agree", c.agree, "max_abs_error", c.max_abs_error, "kernels", c.kernel_names)
    print(name, "call_us", c.call_us, "prepared_us", c.prepared_us)
    for k, ds in c.dispatches.items():
        total = sum(d.per_call_us for d in ds)
        print(f"{name} {k}: device time per call {total:.1f} us over {len(ds)} dispatch kinds")
        for d in sorted(ds, key=lambda d: -d.per_call_us):
            print(f"   {d.name}: {d.per_call_us:.1f} us (count {d.count})")
    print("notes", c.notes)
    Path(sys.argv[1], f"{name}.compare.json").write_text(json.dumps(j, indent=1, default=str))
