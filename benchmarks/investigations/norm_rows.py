"""The library's f16 LayerNorm and RMSNorm of several builds of kernels/norm at model shapes,
one after another, for Nsight Compute; prints each build's largest difference from the first.

    ncu -k regex:norm --metrics gpu__time_duration.sum --csv \\
        python norm_rows.py old=BUILD1 new=BUILD2 > ncu.csv
    python norm_rows.py --table ncu.csv old new

Each shape runs every build in turn, 3 calls of each function (the table takes the median).
"""

import csv
import statistics
import sys
from pathlib import Path

import numpy as np

SHAPES = [(128, 768), (256, 768), (512, 768), (1024, 768), (2048, 768), (4096, 768), (128, 1024), (512, 1024),
          (197, 768), (128, 2048)]
CALLS = 3


def host(a) -> np.ndarray:
    return np.asarray(a.to_host() if hasattr(a, "to_host") else a)


def run(builds: dict[str, Path]) -> None:
    import kitdispatch as kd

    modules = {name: kd.load_module(folder / "norm.vmfb") for name, folder in builds.items()}
    device = next(iter(modules.values())).device
    rng = np.random.default_rng(0)
    for rows, cols in SHAPES:
        x = device.put(rng.standard_normal((rows, cols)).astype(np.float16))
        w = device.put((1 + 0.1 * rng.standard_normal(cols)).astype(np.float16))
        b = device.put((0.1 * rng.standard_normal(cols)).astype(np.float16))
        got = {}
        for name, module in modules.items():
            for _ in range(CALLS):
                y = module.layer_norm_f16(x, w, b, 1e-5, 1)
                r = module.rms_norm_f16(x, w, 1e-5, 1)
            got[name] = (host(y).astype(np.float32), host(r).astype(np.float32))
        first = got[next(iter(got))]
        diff = max(float(np.abs(first[i] - g[i]).max()) for g in got.values() for i in (0, 1))
        print(rows, cols, "largest difference from the first build:", diff, flush=True)


def table(ncu_csv: Path, names: list[str]) -> None:
    lines = ncu_csv.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = [r for r in csv.DictReader(lines[start:]) if r["Metric Name"] == "gpu__time_duration.sum"]
    times = [(r["Kernel Name"].split("(")[0], float(r["Metric Value"].replace(",", "")) / 1000) for r in rows]
    i = 0
    for shape in SHAPES:
        cells = []
        for name in names:
            block, i = times[i:i + 2 * CALLS], i + 2 * CALLS
            layer = statistics.median(t for n, t in block if n.startswith("layer"))
            rms = statistics.median(t for n, t in block if n.startswith("rms"))
            cells.append(f"{name} layer {layer:6.2f} rms {rms:6.2f}")
        print(f"{shape[0]}x{shape[1]}", " | ".join(cells), "us")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:
        table(Path(sys.argv[2]), sys.argv[3:])
    else:
        run({arg.split("=", 1)[0]: Path(arg.split("=", 1)[1]) for arg in sys.argv[1:]})
