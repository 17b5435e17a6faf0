"""Record per-step features of the baselines and every seed row (4 prompts per user) for re-pricing.

Exploration harness of docs/seed_validation.md section 10 (not part of the package). The simulation
is run WITHOUT the verification terms of capacity/cost/step_cost.py (rho = 1, no state snapshots), so that
reprice.py can add any hypothesis on top. Usage (from the repository root, ~3 CPU-minutes x 2):
    PYTHONPATH=. python scripts/seed_verify/record.py 4
"""
import math
from pathlib import Path
from capacity.cost.step_cost import StepCostModel
StepCostModel.__init__.__defaults__ = (1, 1.0, math.inf)   # tp, rho = 1, snapshots free
OUT = Path(__file__).resolve().parent
import pickle, sys, time
import numpy as np, pandas as pd
from capacity.fidelity import speedups as v
from capacity.fidelity.common import pool_map, simulate_scenario
from capacity.measurements.row_scenario import speculative_config
from capacity.measurements.schemas import read_spec_measurements
from capacity.spec.methods import find_method

PPU = int(sys.argv[1]) if len(sys.argv) > 1 else 4
rows = pd.concat([read_spec_measurements(p) for p in v.default_spec_files()], ignore_index=True)
rows["method_name"] = [getattr(find_method(m), "name", None) for m in rows["method"]]
t0 = time.time()
loads, failed = v.infer_loads(rows, workers=2, progress=False, prompts_per_user=PPU)
print("loads", {k: l.concurrency for k, l in loads.items()}, failed, time.time() - t0, flush=True)

def rec_of(res):
    r = res.cluster.replicas[0].recorder
    f = np.array(r.features, dtype=float)
    req = res.requests
    return dict(features=f, draft_s=np.array(r.draft_s, dtype=float), duration=float(res.metrics["duration_s"]),
                out=float(req.output_tokens[np.isfinite(req.finish_s)].sum()),
                tau=1.0 + float(req.spec_accepted.sum()) / max(float(req.spec_steps.sum()), 1.0),
                tput=float(res.metrics["output_throughput_tok_s"]))

def job(args):
    kind, row, load = args
    if kind == "base":
        sc = v.scenario_dict(load.deployment, load.concurrency, PPU)
    else:
        sc = v.scenario_dict(load.deployment, load.concurrency, PPU, speculative_config(row))
    return rec_of(simulate_scenario(sc))

jobs = [("base", None, l) for l in loads.values()]
recs = rows.to_dict(orient="records")
jobs += [("spec", r, loads[r["target"]]) for r in recs]
out = pool_map(job, jobs, 2, False, "rec")
nb = len(loads)
data = dict(rows=rows, loads=loads, base={t: o for t, o in zip(loads, out[:nb])}, spec=out[nb:], ppu=PPU)
pickle.dump(data, open(OUT / f"rec_ppu{PPU}.pkl", "wb"))
print("done", time.time() - t0)
