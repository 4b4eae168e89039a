"""numpy references of the f32 attention kernels: kernels/attention's, which compute in float64
and round once to the input type (f32 here), under the _f32 names."""

import runpy
from pathlib import Path

_F16 = runpy.run_path(str(Path(__file__).resolve().parent.parent / "attention" / "reference.py"))

globals().update({name[: -len("_f16")] + "_f32": f for name, f in _F16.items() if name.startswith("attention") and name.endswith("_f16")})
