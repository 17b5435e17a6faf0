"""Simulator speed: simulated seconds per wall second and requests per wall second.

Run by hand (not in CI):  python benchmarks/speed.py
Cases: the built-in default scenario (one replica), and one hour of 10 req/s Poisson traffic on
8 replicas of the default deployment.
"""

from __future__ import annotations

import time

from capacity import scenario, simulate


def measure(name: str, sc) -> None:
    t0 = time.perf_counter()
    res = simulate.run(sc)
    wall = time.perf_counter() - t0
    n = res.metrics["num_requests"]
    print(f"{name:46} {res.sim_time_s:9.0f} sim s {wall:8.2f} wall s  {res.sim_time_s / wall:8.0f}× real time  "
          f"{n / wall:8.0f} requests/s  {res.num_steps / wall:8.0f} steps/s  stable={res.stable}")


def main() -> None:
    measure("default scenario (1 replica)", scenario.load(None))
    hour = scenario.load(None, ["deployment.replicas=8", "traffic.arrival.rate_rps=10", "traffic.num_requests=36000"])
    measure("1 h of 10 req/s on 8 replicas", hour)


if __name__ == "__main__":
    main()
