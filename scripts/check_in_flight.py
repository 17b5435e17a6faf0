"""Check each closed-loop serving row's measured load against the KV capacity the simulator gives it.

    python scripts/check_in_flight.py [GPU ...]      (default: every GPU with serving rows)

Little's law on the decode phase: output tok/s x TPOT is how many requests were decoding at once. That
count depends on no fitted efficiency. The simulator's memory model (`capacity.sim.simulate.deploy`)
says how many requests of the row's mean context (prompt + half the output) its KV cache holds. A row
whose count is well under its users, that capacity and its max_num_seqs was limited by something the scenario does
not say: a KV cache of another dtype than the script states, or a cap outside the engine
(docs/seed_validation.md section 30). Prints every row at 16 or more users, flagging ratios under
--flag-below (`capacity calibrate` warns about the same rows, from the lengths it drew). Run by hand
(seconds); not part of the tests.
"""

from __future__ import annotations

import argparse

import pandas as pd

from capacity.fidelity.common import IN_FLIGHT_SHORTFALL, decoding_at_once, kv_holds_requests, requests_allowed
from capacity.measurements.row_scenario import row_scenario
from capacity.measurements.schemas import read_measurements
from capacity.paths import data_dir

NUMERIC = ("concurrency_or_qps", "isl", "osl", "tp", "tpot_ms", "ttft_ms", "output_tok_s_per_gpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gpus", nargs="*")
    ap.add_argument("--flag-below", type=float, default=IN_FLIGHT_SHORTFALL)
    ap.add_argument("--min-users", type=float, default=16)
    args = ap.parse_args()
    rows = read_measurements(data_dir() / "measurements" / "serving_vllm.csv")
    for c in NUMERIC:
        rows[c] = pd.to_numeric(rows[c], errors="coerce")
    if args.gpus:
        rows = rows[rows.gpu.isin(args.gpus)]
    rows = rows[rows.concurrency_or_qps >= args.min_users]
    for _, r in rows.iterrows():
        sc, _ = row_scenario(r.to_dict())
        decoding = decoding_at_once(r.to_dict(), r.tp)
        if sc is None or not decoding == decoding:
            continue
        holds = kv_holds_requests(sc, r.isl + r.osl / 2)
        ratio = decoding / requests_allowed(sc, r.concurrency_or_qps, holds)
        print(f"{r.gpu:7} {r.model[:24]:24} {str(r.framework_version)[-8:]:8} TP{int(r.tp)} {int(r.isl)}/{int(r.osl)} "
              f"{int(r.concurrency_or_qps):4d} users: TTFT {r.ttft_ms:9.0f} ms, decoding {decoding:6.1f}, "
              f"KV holds {holds:7.1f} ({sc['deployment'].get('kv_cache_dtype', 'auto')}), ratio {ratio:.2f}"
              + ("  <<" if ratio < args.flag_below else ""))


if __name__ == "__main__":
    main()
