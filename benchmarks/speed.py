"""Simulator speed: simulated seconds per wall second and requests per wall second.

Run by hand (not in CI):

    python benchmarks/speed.py [--repeat N] [--hour-repeat N] [--skip-hour] [--cold-repeat N] [--reference REV]

Cases: the single-turn chatbot (scenarios/chatbot_single_turn.yaml, one replica), one hour of
10 req/s Poisson traffic on 8 replicas of it, and the default's conversations on 4 replicas behind
session affinity (2,000 sessions) with prefix caching on and off; the on / off ratio is what
caching costs the simulator.

* warm: `simulate.run` in a worker process that has already imported everything and run one
  simulation, as in a sweep of many scenarios (the figure engineers care about); best and median
  of `--repeat` runs (the hour: `--hour-repeat`, default 1).
* cold: a fresh `capacity simulate` process on the default scenario, as a user types it (that
  command also simulates the same traffic without speculation, so it runs two simulations), and
  with `--no-compare` (one simulation); the wall time includes starting Python and importing.
  Median of `--cold-repeat` processes. Then the phases of a cold `--no-compare` run, measured in
  a fresh process that does what the command does with a clock between the steps: interpreter
  start and exit, imports, scenario, set-up (`simulate.deploy`: GPU, model, KV cache, price tables;
  and drawing the traffic, `build_requests`, which reads the length trace), the simulation itself,
  the JSON output; and which packages the imports spend their time in (`python -X importtime` on
  that run, imports made during the run included, each module's own time summed per top-level
  package, `capacity` per subpackage, median of `--cold-repeat` processes; importtime's own overhead
  makes these larger than the plain phases).

`--reference REV` checks the git revision REV out into a temporary worktree (`git worktree add
--detach`, removed at the end) and runs every case on it too, in the same invocation, alternating
with the working tree run by run (warm: two long-lived worker processes, one per version, asked in
turn; cold: fresh processes in turn), and prints the after / before ratio of each case: the median
of the paired ratios, with its range. On a machine shared with other work, single figures move by
±20 % from minute to minute; the paired ratio is what shows a change. Both versions run this file's
benchmark code with PYTHONPATH pointing at their own tree (and the working directory a temporary
folder, so neither picks up the other's package); each worker says which `capacity` it imported,
and each warm case says whether the two versions' results (metrics, step-time breakdown, steps,
simulated time: a digest) are identical.

Every figure is given as wall time and as CPU time (the worker's `time.process_time`, a cold
process's user + system time from `getrusage`): on a machine where other work competes for the
cores, CPU time moves much less than wall time and is the better figure to compare by; on a quiet
machine the two agree for the warm cases.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOUR = ["deployment.replicas=8", "traffic.arrival.rate_rps=10", "traffic.num_requests=36000"]
# (what it is, scenario, overrides). SINGLE is the chatbot of independent requests (the default before
# the default became multi-turn: an older tree has no chatbot_single_turn.yaml and runs its default).
SINGLE = "chatbot_single_turn"
CONVERSATIONS = ["deployment.replicas=4", "deployment.router=session_affinity",
                 "traffic.arrival.rate_sessions_per_s=4", "traffic.arrival.num_sessions=2000"]
CASES = {
    "default": ("single-turn chatbot (1 replica)", SINGLE, []),
    "hour": ("1 h of 10 req/s on 8 replicas", SINGLE, HOUR),
    "conversations": ("conversations, 4 replicas, caching on", "default", CONVERSATIONS),
    "conversations_off": ("conversations, 4 replicas, caching off", "default",
                          CONVERSATIONS + ["engine.enable_prefix_caching=false"]),
}
COLD = {"simulate": [], "simulate --no-compare": ["--no-compare"]}
PHASES = ("interpreter start and exit", "imports", "scenario", "set-up (deploy + traffic)", "simulation", "output")


# ------------------------------------------------------------------------------------- worker side
def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def worker() -> None:
    """Line protocol on stdin/stdout: a case name in, one JSON line out; 'quit' ends."""
    import capacity
    from capacity.inputs import scenario
    from capacity.sim import simulate

    def load(name: str, overrides: list[str]):
        try:
            return scenario.load(name, overrides)
        except Exception:                                   # an older tree: no such scenario or key
            return scenario.load(None, overrides) if name == SINGLE else None

    # where the package and the engine came from, before anything runs: in a tree without capacity/sim (before
    # the layout, 3a06c49) the import falls through to the installed package, which the driver then refuses
    print(json.dumps({"capacity": capacity.__file__, "simulate": simulate.__file__}), flush=True)
    scenarios = {name: load(sc, overrides) for name, (_, sc, overrides) in CASES.items()}
    simulate.run(scenarios["default"])                     # warm-up: imports, model configs, caches
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        name = line.strip()
        if name == "quit":
            break
        if scenarios[name] is None:
            print(json.dumps({"missing": True}), flush=True)
            continue
        w0, c0 = _clock()
        res = simulate.run(scenarios[name])
        w1, c1 = _clock()
        digest = hashlib.sha256(json.dumps([res.metrics, res.step_breakdown_s, res.num_steps, res.sim_time_s],
                                           sort_keys=True, default=repr).encode()).hexdigest()[:16]
        print(json.dumps({"wall": w1 - w0, "cpu": c1 - c0, "sim_s": res.sim_time_s, "steps": res.num_steps,
                          "requests": res.metrics["num_requests"], "digest": digest}), flush=True)


# What `capacity simulate --no-compare --json` does, with clocks (wall, CPU) between the steps, run as
# `python -c` so that nothing but the command's own imports happens (one JSON line: {phase: [wall s, CPU s]}).
PHASES_DRIVER = """
import time
marks = [(time.perf_counter(), time.process_time())]
import capacity.cli                                     # the command's parser module
from capacity.inputs import scenario
from capacity.sim import simulate, summary
from capacity.util.jsonio import print_json
marks.append((time.perf_counter(), time.process_time()))
sc = scenario.load(None)
marks.append((time.perf_counter(), time.process_time()))
setup = [0.0, 0.0]
def timed(fn):
    def wrapper(*args, **kwargs):
        w, c = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            setup[0] += time.perf_counter() - w
            setup[1] += time.process_time() - c
    return wrapper
simulate.deploy = timed(simulate.deploy)                  # set-up: GPU, model, KV cache, price tables
simulate.build_requests = timed(simulate.build_requests)  # drawing the traffic (reads the length trace)
result = simulate.run(sc)
marks.append((time.perf_counter(), time.process_time()))
import io, json, sys
payload = summary.simulation_payload(result)
out, sys.stdout = sys.stdout, io.StringIO()
try:
    print_json(payload)
finally:
    sys.stdout = out
marks.append((time.perf_counter(), time.process_time()))
d = [[b[i] - a[i] for i in (0, 1)] for a, b in zip(marks, marks[1:])]
print(json.dumps({"inside": [marks[-1][i] - marks[0][i] for i in (0, 1)], "imports": d[0], "scenario": d[1],
                  "set-up (deploy + traffic)": setup, "simulation": [d[2][i] - setup[i] for i in (0, 1)],
                  "output": d[3], "sim_s": result.sim_time_s}), flush=True)
"""


# ------------------------------------------------------------------------------------- driver side
class Version:
    def __init__(self, label: str, root: Path, tmp: Path):
        self.label, self.root = label, root
        self.env = {**os.environ, "PYTHONPATH": str(root)}
        self.cwd = tmp
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker"], env=self.env,
                                     cwd=self.cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        hello = json.loads(self.proc.stdout.readline())
        for module in ("capacity", "simulate"):
            where = Path(hello[module]).resolve()
            if self.root.resolve() not in where.parents:
                raise SystemExit(f"{self.label}: the worker imported {where}, not the package under {self.root} "
                                 "(a revision before the capacity/sim layout, 3a06c49? run its own benchmarks/speed.py)")
        json.loads(self.proc.stdout.readline())             # warmed up

    def warm(self, case: str) -> dict:
        self.proc.stdin.write(case + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except BrokenPipeError:                         # the worker has exited already (it failed)
                pass
            self.proc.wait()

    def _child(self, cmd: list[str]) -> tuple[float, float, str, str]:
        """(wall s, CPU s of the child, stdout, stderr) of one fresh process."""
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run(cmd, env=self.env, cwd=self.cwd, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), out.stdout, out.stderr

    def cold(self, extra: list[str]) -> tuple[float, float]:
        wall, cpu, _, _ = self._child([sys.executable, "-m", "capacity.cli", "simulate", "--json", *extra])
        return wall, cpu

    def phases(self) -> dict[str, list[float]]:
        wall, cpu, out, _ = self._child([sys.executable, "-c", PHASES_DRIVER])
        got = json.loads(out.strip().splitlines()[-1])
        inside = got.pop("inside")
        got["interpreter start and exit"] = [wall - inside[0], cpu - inside[1]]
        got["total"] = [wall, cpu]
        return got

    def import_breakdown(self) -> dict[str, float]:
        """Seconds of import time per top-level package (each module's own time), from -X importtime."""
        err = self._child([sys.executable, "-X", "importtime", "-c", PHASES_DRIVER])[3]
        per: dict[str, float] = {}
        for line in err.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            self_us, _, name = (part.strip() for part in line[len("import time:"):].split("|", 2))
            pkg = name.split(".")[0]
            pkg = name.rsplit(".", 1)[0] if pkg == "capacity" and "." in name else pkg
            per[pkg] = per.get(pkg, 0.0) + int(self_us) / 1e6
        return per


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def _range(xs: list[float]) -> str:
    return f"{min(xs):.3f}-{max(xs):.3f}"


def _worktree(rev: str, tmp: Path) -> Path:
    path = tmp / "reference"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(path), rev], check=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="warm runs of the default scenario per version")
    ap.add_argument("--hour-repeat", type=int, default=1, help="warm runs of the 8-replica hour per version")
    ap.add_argument("--cold-repeat", type=int, default=3, help="cold processes per command and version")
    ap.add_argument("--skip-hour", action="store_true", help="not the 8-replica hour")
    ap.add_argument("--reference", metavar="REV", help="also run a git revision (e.g. HEAD, a commit) and print "
                                                       "the after / before ratios")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker()

    with tempfile.TemporaryDirectory(prefix="capacity-speed-") as tmp_s:
        tmp = Path(tmp_s)
        versions = [Version("after", ROOT, tmp)]
        tree = None
        if args.reference:
            rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.reference], check=True,
                                 capture_output=True, text=True).stdout.strip()
            tree = _worktree(rev, tmp)
            versions.append(Version(f"before ({rev})", tree, tmp))
        try:
            run(args, versions)
        finally:
            for v in versions:
                v.stop()
            if tree is not None:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)


def _alternating(versions: list[Version], n: int):
    """(i, version) for n rounds, the order flipped every round (after, before; before, after; ...)."""
    for i in range(n):
        for v in (versions if i % 2 == 0 else versions[::-1]):
            yield i, v


def run(args: argparse.Namespace, versions: list[Version]) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  load average {load:.2f}  python {sys.version.split()[0]}  "
          f"{os.cpu_count()} CPUs")
    for v in versions:
        print(f"  {v.label}: {v.root}")
    for v in versions:
        v.start()
    ratios: list[tuple[str, list[float]]] = []

    cases = [("default", args.repeat)] + ([] if args.skip_hour else [("hour", args.hour_repeat)]) \
        + [("conversations", args.repeat), ("conversations_off", args.repeat)]
    warm: dict[str, dict[str, list[dict]]] = {}
    for case, n in cases:
        got: dict[str, list[dict]] = {v.label: [] for v in versions}
        for _, v in _alternating(versions, n):
            r = v.warm(case)
            if not r.get("missing"):
                got[v.label].append(r)
        warm[case] = got
        if any(not rs for rs in got.values()):
            print(f"warm  {CASES[case][0]:32} (not in {', '.join(k for k, rs in got.items() if not rs)})")
            continue
        for v in versions:
            rs = got[v.label]
            walls = [r["wall"] for r in rs]
            best, med = min(walls), _median(walls)
            r0 = rs[0]
            print(f"warm  {CASES[case][0]:32} {v.label:16} {r0['sim_s']:6.0f} sim s  wall best {best:6.2f} s "
                  f"median {med:6.2f} s  {r0['sim_s'] / best:6.0f}x real time (best) {r0['sim_s'] / med:6.0f}x "
                  f"(median)  {r0['requests'] / best:6.0f} requests/s  {r0['steps'] / best:7.0f} steps/s  "
                  f"({r0['steps']} steps; CPU median {_median([r['cpu'] for r in rs]):.2f} s)")
        if len(versions) == 2:
            a, b = (got[v.label] for v in versions)
            same = {x["digest"] for x in a + b}
            print(f"      results (metrics, step-time breakdown, steps, simulated time) "
                  f"{'identical' if len(same) == 1 else 'DIFFER'} between the versions ({', '.join(sorted(same))})")
            for clock in ("wall", "cpu"):
                ratios.append((f"warm {CASES[case][0]}, {clock}", [x[clock] / y[clock] for x, y in zip(a, b)]))

    # what prefix caching costs: the same conversations with caching on over caching off (CPU time)
    for v in versions:
        on, off = warm.get("conversations", {}).get(v.label), warm.get("conversations_off", {}).get(v.label)
        if on and off:
            per_step = [(r["cpu"] / r["steps"]) for r in on], [(r["cpu"] / r["steps"]) for r in off]
            print(f"prefix caching on / off ({v.label}): CPU {_median([r['cpu'] for r in on]) / _median([r['cpu'] for r in off]):.2f}x, "
                  f"wall {_median([r['wall'] for r in on]) / _median([r['wall'] for r in off]):.2f}x per run; "
                  f"CPU per engine step {_median(per_step[0]) / _median(per_step[1]):.2f}x (with caching the "
                  f"simulated engine runs {on[0]['steps'] / off[0]['steps']:.2f}x the steps: shorter prefills, "
                  f"smaller batches)")

    for label, extra in COLD.items():
        got_c: dict[str, list[tuple[float, float]]] = {v.label: [] for v in versions}
        for _, v in _alternating(versions, args.cold_repeat):
            got_c[v.label].append(v.cold(extra))
        for v in versions:
            w = [x[0] for x in got_c[v.label]]
            c = [x[1] for x in got_c[v.label]]
            print(f"cold  capacity {label:27} {v.label:16} wall median {_median(w):5.2f} s (runs {_range(w)} s), "
                  f"CPU median {_median(c):5.2f} s; one process, imports included")
        if len(versions) == 2:
            a, b = (got_c[v.label] for v in versions)
            for i, clock in enumerate(("wall", "cpu")):
                ratios.append((f"cold capacity {label}, {clock}", [x[i] / y[i] for x, y in zip(a, b)]))

    phases: dict[str, list[dict]] = {v.label: [] for v in versions}
    for _, v in _alternating(versions, args.cold_repeat):
        phases[v.label].append(v.phases())
    for p_list in phases.values():
        for p in p_list:
            p["= import and set-up"] = [p["total"][i] - p["simulation"][i] - p["output"][i] for i in (0, 1)]
    print(f"\ncold phases of `capacity simulate --no-compare --json` (median of {args.cold_repeat} fresh processes; "
          "wall s / CPU s):")
    print(f"  {'phase':32}" + "".join(f"{v.label:>22}" for v in versions))
    for name in PHASES + ("total", "= import and set-up"):
        print(f"  {name:32}" + "".join(
            f"{_median([p[name][0] for p in phases[v.label]]):12.3f} /{_median([p[name][1] for p in phases[v.label]]):7.3f}"
            for v in versions))
    print("  (import and set-up = total - simulation - output: interpreter, imports, scenario, set-up)")
    if len(versions) == 2:
        a, b = (phases[v.label] for v in versions)
        for i, clock in enumerate(("wall", "cpu")):
            ratios.append((f"cold import and set-up, {clock}",
                           [x["= import and set-up"][i] / y["= import and set-up"][i] for x, y in zip(a, b)]))

    runs: dict[str, list[dict[str, float]]] = {v.label: [] for v in versions}
    for _, v in _alternating(versions, args.cold_repeat):
        runs[v.label].append(v.import_breakdown())
    brk = {label: {k: _median([r.get(k, 0.0) for r in rs]) for k in set().union(*rs)} for label, rs in runs.items()}
    print(f"\nimport time per package in a cold `--no-compare` run (python -X importtime, each module's own time, "
          f"imports made during the run included; median of {args.cold_repeat} processes per package, s):")
    names = sorted(set().union(*brk.values()), key=lambda k: -max(b.get(k, 0.0) for b in brk.values()))
    print(f"  {'package':32}" + "".join(f"{v.label:>18}" for v in versions))
    shown = [k for k in names if max(b.get(k, 0.0) for b in brk.values()) >= 0.02]
    for k in shown:
        print(f"  {k:32}" + "".join(f"{brk[v.label].get(k, 0.0):18.3f}" for v in versions))
    print(f"  {'(others)':32}" + "".join(
        f"{sum(x for k, x in brk[v.label].items() if k not in shown):18.3f}" for v in versions))
    print(f"  {'total (median of the totals)':32}" + "".join(
        f"{_median([sum(r.values()) for r in runs[v.label]]):18.3f}" for v in versions))

    if ratios:
        print(f"\nafter / before ({versions[0].label} vs {versions[1].label}), paired runs in alternation:")
        for label, rs in ratios:
            print(f"  {label:48} median {_median(rs):.3f}  (pairs {len(rs)}, range {_range(rs)})")


if __name__ == "__main__":
    main()
