"""Simulator speed: simulated seconds per wall second and requests per wall second.

Run by hand (not in CI):  python benchmarks/speed.py [--skip-hour] [--repeat N]

Cases: the built-in default scenario (one replica), and one hour of 10 req/s Poisson traffic on
8 replicas of the default deployment.

* warm: `simulate.run` in a process that has already imported everything and run one simulation,
  as in a sweep of many scenarios (the figure engineers care about); the best of `--repeat` runs.
* cold: one fresh `capacity simulate` process on the default scenario, as a user types it (that
  command also simulates the same traffic without speculation, so it runs two simulations), and
  with `--no-compare` (one simulation); the wall time includes starting Python and importing.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from capacity.inputs import scenario

from capacity.sim import simulate

HOUR = ["deployment.replicas=8", "traffic.arrival.rate_rps=10", "traffic.num_requests=36000"]


def warm(name: str, sc, repeat: int) -> None:
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = simulate.run(sc)
        wall = time.perf_counter() - t0
        best = wall if best is None else min(best, wall)
    n = res.metrics["num_requests"]
    print(f"warm  {name:34} {res.sim_time_s:7.0f} sim s {best:7.2f} wall s {res.sim_time_s / best:7.0f}x real time "
          f"{n / best:7.0f} requests/s {res.num_steps / best:8.0f} steps/s")


def cold(extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "capacity.cli", "simulate", "--json", *extra]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    sim_s = simulate.run(scenario.load(None)).sim_time_s
    label = "capacity simulate " + " ".join(extra)
    print(f"cold  {label:34} {sim_s:7.0f} sim s {wall:7.2f} wall s {sim_s / wall:7.0f}x real time "
          f"(one process, imports included)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="warm runs per case; the best is reported")
    ap.add_argument("--skip-hour", action="store_true", help="only the default scenario")
    args = ap.parse_args()
    default = scenario.load(None)
    simulate.run(default)                                   # warm-up: imports, model configs, caches
    warm("default scenario (1 replica)", default, args.repeat)
    if not args.skip_hour:
        warm("1 h of 10 req/s on 8 replicas", scenario.load(None, HOUR), 1)
    cold([])
    cold(["--no-compare"])


if __name__ == "__main__":
    main()
