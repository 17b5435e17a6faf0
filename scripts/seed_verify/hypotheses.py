"""The hypothesis fits of docs/seed_validation.md section 10 (each line: fitted and LOTO median,
p90, bias, best-N regret; fitted parameters; per-method overheads in us).
    PYTHONPATH=. python scripts/seed_verify/record.py 4 && PYTHONPATH=. python scripts/seed_verify/hypotheses.py
"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit import *

B = [5000.0]
print("-- overheads fitted in [0, 20 ms] (the current calibration)")
evaluate("none", [], [], [], [])
for name, k, x0, lo, hi in [("c fix_ms", ["fix_ms"], [1.0], [0], [100]), ("c seq_us", ["seq_us"], [50.0], [0], B),
                            ("c layer_us", ["layer_us"], [50.0], [0], B), ("b1 kappa_kv", ["kappa_kv"], [5.0], [0], [500]),
                            ("b1 kappa_kvq", ["kappa_kvq"], [2.0], [0], [500]), ("b2 mtile", ["mtile"], [16.0], [1], [1024]),
                            ("a rho", ["rho"], [0.7], [0.0], [1.0]), ("d gdn_snap", ["gdn_snap"], [2.0], [0], [100])]:
    evaluate(name, k, x0, lo, hi)
evaluate("rho=0.5, gdn_snap=1", [], [], [], [], fixed={"rho": 0.5, "gdn_snap": 1.0})
evaluate("rho=0.5, gdn_snap=4 (committed)", [], [], [], [], fixed={"rho": 0.5, "gdn_snap": 4.0})
print("-- overheads bounded to [0, 1 ms] (physical range of a draft forward's fixed cost)")
evaluate("rho + gdn_snap", ["gdn_snap", "rho"], [2.0, 0.6], [0, 0], [100, 1], ov_hi=1000.0)
evaluate("rho=0.5, gdn_snap=4 (committed)", [], [], [], [], fixed={"rho": 0.5, "gdn_snap": 4.0}, ov_hi=1000.0)
evaluate("seq_us + gdn_snap + rho", ["seq_us", "gdn_snap", "rho"], [100., 4.0, 0.5], [0, 0, 0], [5000, 100, 1], ov_hi=1000.0)
evaluate("fix_ms + gdn_snap + rho", ["fix_ms", "gdn_snap", "rho"], [3., 4.0, 0.5], [0, 0, 0], [100, 100, 1], ov_hi=1000.0)
evaluate("seq_us v1/v2 + gdn_snap + rho", ["seq_us_v1", "seq_us_v2", "gdn_snap", "rho"], [300., 100., 4.0, 0.5],
         [0, 0, 0, 0], [5000, 5000, 100, 1], ov_hi=1000.0, loto=False)
T = sorted(set(targets))
fk = ["fixT_" + CM[t].model.name for t in T]
evaluate("DIAGNOSTIC per-target fixed cost + gdn_snap + rho", fk + ["gdn_snap", "rho"], [5.0] * len(fk) + [2.0, 0.6],
         [0] * len(fk) + [0, 0], [100] * len(fk) + [100, 1], loto=False, verbose=True, ov_hi=1000.0)
