"""Leave one GPU out: predict a GPU's shipped serving rows with ANOTHER GPU's efficiencies, no refit.

    python scripts/leave_one_gpu_out.py H100:H200 H200:H100 MI300X:MI355X [--workers 2] [--max-rows N] [--own] [--out DIR]
        [--target-host]

What is transferred and why: capacity/fidelity/transfer.py (`capacity calibrate` reports the same for a fit's family
siblings). `--own` also prints the TARGET's error with its own shipped fit (the fitted-row error); `--target-host` keeps
the TARGET's own host times. Prints median / p90 absolute percentage error of output tok/s per GPU, TPOT and TTFT. Run
by hand (minutes per pair); not part of the tests.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from capacity.fidelity.serving import run as run_rows
from capacity.fidelity.transfer import errors, predict
from capacity.inputs.hardware import load_gpu


def line(label: str, table: dict[str, dict[str, float]]) -> str:
    cells = ", ".join(f"{m} {t['median_pct']:.1f} / {t['p90_pct']:.1f} % ({t['rows']} rows)" for m, t in table.items())
    return f"{label:34} {cells}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pairs", nargs="+", help="SOURCE:TARGET GPU names")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--max-rows", type=int, default=None)
    ap.add_argument("--own", action="store_true", help="also the target's error with its own shipped fit")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, help="folder: each pair's predicted rows as SOURCE_on_TARGET.csv")
    ap.add_argument("--target-host", action="store_true",
                    help="keep the TARGET's own host times (HOST_EFFICIENCY_KEYS): the GPU-side efficiencies' error")
    args = ap.parse_args()
    results = []
    for pair in args.pairs:
        source, target = pair.split(":")
        out = predict(load_gpu(source), target, target_host=args.target_host, workers=args.workers,
                      max_rows=args.max_rows)
        res = {"source": source, "target": target, "transferred": errors(out)}
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            out.to_csv(Path(args.out) / f"{source}_on_{target}.csv", index=False)
        if args.own:
            own = run_rows(gpus=[target], workers=args.workers, max_rows=args.max_rows, progress=False).rows
            res["own_fit"] = errors(own)
        results.append(res)
        if not args.json:
            label = f"{target} with {source}'s efficiencies" + (f" ({target}'s host times)" if args.target_host else "")
            print(line(label, res["transferred"]), flush=True)
            if args.own:
                print(line(f"{target} with its own fit", res["own_fit"]), flush=True)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
