"""A model's build by rule, its tuned build and IREE alone, whole calls taking turns (round 36: BERT
b1s128's tuned build replaces the rule's very ops; one run of hf_models.py had its prepared call
at 86.5 us against 70.7). On the GPU machine, over a folder that `hf_models.py build` and
`build-tuned` wrote (NAME, NAME.tuned, NAME.params.npz):

    python benchmarks/investigations/tuned_vs_rule_calls.py BUILD_DIR bert-f16-b1s128 [--rounds 7]
"""
import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hf_models import NAME_RE, draw_parameters, model_inputs

import kitdispatch as kd
from kitdispatch.describe.model_record import read_model_record
from kitdispatch.models.compare import invoker_call_us, prepared_call_us


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("build_dir", type=Path)
    p.add_argument("model")
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    root, name = args.build_dir, args.model
    m = NAME_RE.match(name)
    with tempfile.TemporaryDirectory() as tmp:
        irpa = Path(tmp) / "w.irpa"
        draw_parameters(root / f"{name}.params.npz", irpa)
        inputs = model_inputs(m["model"], int(m["batch"]), int(m["seq"]), m["dtype"])
        function = read_model_record(root / name)[1].function(None).name
        mods = {"rule": kd.load_module(root / name, parameters=irpa), "tuned": kd.load_module(root / f"{name}.tuned", parameters=irpa),
                "IREE alone": kd.load_module(root / name, baseline=True, parameters=irpa)}
        prepared: dict[str, list[float]] = {k: [] for k in mods}
        iree: dict[str, list[float]] = {k: [] for k in mods}
        for _ in range(args.rounds):
            for k, module in mods.items():
                prepared[k].append(prepared_call_us(module, function, inputs, repetitions=50))
                iree[k].append(invoker_call_us(module, function, inputs, repetitions=50))
    for k in mods:
        print(f"{k:11s} kit's prepared call: median {statistics.median(prepared[k]):6.1f} us (rounds {', '.join(f'{v:.1f}' for v in prepared[k])}); "
              f"IREE's synchronous call: median {statistics.median(iree[k]):6.1f} us")


if __name__ == "__main__":
    main()
