"""`capacity sweep`: run a scenario over a grid of what-ifs, in parallel, resumably.

A sweep scenario is a normal scenario YAML plus a `sweep:` section (removed before validation)
that declares a grid over dotted scenario keys, the same keys `--set` takes:

    sweep:
      product:                       # Cartesian product
        traffic.arrival.rate_rps: [1, 2, 4]
        deployment.gpu: [MI300X, MI355X]
      zip:                           # equal-length lists walked together, crossed with the product
        speculative.method: [none, eagle3]
        speculative.num_speculative_tokens: [0, 3]

Every grid point has a `point_id`, a short hash of its canonical overrides (independent of the
order of keys in the YAML), and is simulated on a deep copy of the base scenario with its
overrides applied (`scenario.apply_overrides`). Points run in a local process pool or on a Dask
cluster; each finished point is appended at once to `results.jsonl` in the output folder (one
JSON line per point, written whole and fsync'd), so a killed sweep loses at most the points that
were running and `--resume` runs only what is missing. `sweep.json` (the manifest, written at the
start) records the base scenario's hash, the grid and the point ids. `load_results(dir)` reads a
folder back as a pandas DataFrame, one row per grid point in grid order.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import logging
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable, Iterable

import pandas as pd
import yaml
from tqdm import tqdm

from capacity import __version__
from capacity.errors import CapacityError
from capacity.inputs import scenario as scenario_mod
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model
from capacity.sim import simulate
from capacity.sim.metrics import flatten_metrics
from capacity.sim.summary import speculation_by_batch
from capacity.spec.methods import get_method
from capacity.util.jsonio import clean
from capacity.util.text import quote

RESULTS_FILE = "results.jsonl"
MANIFEST_FILE = "sweep.json"
SWEEP_KEY = "sweep"
DASK_CONNECT_TIMEOUT_S = 5.0
MANIFEST_SCHEMA = 1


# ---------------------------------------------------------------------- the grid
@dataclass(frozen=True)
class Point:
    """One grid point: its position in grid order, its id and its overrides (dotted key -> value)."""

    index: int
    point_id: str
    overrides: dict[str, Any]

    def set_args(self) -> list[str]:
        """The overrides as `--set` arguments (`dotted.key=value`, the value as YAML)."""
        return [f"{k}={yaml_value(v)}" for k, v in self.overrides.items()]

    def describe(self) -> str:
        return ", ".join(self.set_args())


@dataclass(frozen=True)
class SweepSpec:
    """A sweep scenario: the base scenario dict (without `sweep:`), the grid and its points."""

    source: str
    base: dict[str, Any]
    product: dict[str, list[Any]]
    zip: dict[str, list[Any]]
    points: tuple[Point, ...]

    @property
    def name(self) -> str:
        return str(self.base.get("name") or "scenario")

    @property
    def scenario_hash(self) -> str:
        return scenario_hash(self.base)

    @property
    def keys(self) -> list[str]:
        return [*self.product, *self.zip]


def yaml_value(value: Any) -> str:
    """`value` written so that `yaml.safe_load` (what `--set` uses) reads back the same value."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, sort_keys=True).strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")]
    return text


def _canonical(value: Any) -> Any:
    """Values that mean the same scenario hash the same: 2 and 2.0, mapping key order."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def _digest(obj: Any) -> str:
    text = json.dumps(_canonical(obj), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def point_id(overrides: dict[str, Any]) -> str:
    """A short stable id of a grid point: a hash of its canonical overrides (order-independent)."""
    return _digest(overrides)[:12]


def scenario_hash(base: dict[str, Any]) -> str:
    """Hash of the base scenario (the YAML without its sweep section; key order does not matter)."""
    return _digest(base)[:16]


def _values(section: str, key: Any, values: Any) -> list[Any]:
    if not isinstance(key, str) or not key or any(not part for part in key.split(".")):
        raise CapacityError(f"sweep.{section}: '{quote(key)}' is not a dotted scenario key such as traffic.arrival.rate_rps")
    if not isinstance(values, list):
        raise CapacityError(f"sweep.{section}.{quote(key)}: give a list of values, e.g. [1, 2, 4]")
    if not values:
        raise CapacityError(f"sweep.{section}.{quote(key)} is an empty list: the grid would be empty; give at least one value")
    return values


MAX_POINTS = 100_000     # each point is a simulation of seconds to minutes: more is a typo, or a job to split


def expand_grid(sweep: Any) -> tuple[dict[str, list[Any]], dict[str, list[Any]], list[Point]]:
    """The `sweep:` section -> (product, zip, points in grid order).

    Grid order: the product's keys in the order given (the last one varies fastest), and for each
    product combination the zip's entries in order. Raises CapacityError for an empty grid, unequal
    zip lengths, a key given twice, or a key inside another swept key.
    """
    if sweep is None:
        sweep = {}
    if not isinstance(sweep, dict):
        raise CapacityError("sweep: must be a mapping with 'product' and/or 'zip' sections")
    unknown = sorted(set(sweep) - {"product", "zip"})
    if unknown:
        raise CapacityError(f"sweep: unknown section '{unknown[0]}'; use 'product' (Cartesian product) and/or 'zip' (lists walked together)")
    sections: dict[str, dict[str, list[Any]]] = {}
    for section in ("product", "zip"):
        raw = sweep.get(section) or {}
        if not isinstance(raw, dict):
            raise CapacityError(f"sweep.{section}: must map dotted scenario keys to lists of values")
        sections[section] = {k: _values(section, k, v) for k, v in raw.items()}
    product, zipped = sections["product"], sections["zip"]
    if not product and not zipped:
        raise CapacityError("the sweep grid is empty: add sweep.product and/or sweep.zip with dotted keys and lists of values, "
                            "e.g. sweep: {product: {traffic.arrival.rate_rps: [1, 2, 4]}}")
    both = sorted(set(product) & set(zipped))
    if both:
        raise CapacityError(f"sweep: '{both[0]}' is in both product and zip; keep it in one of them")
    keys = [*product, *zipped]
    for a in keys:
        for b in keys:
            if a != b and b.startswith(a + "."):
                raise CapacityError(f"sweep: '{b}' is inside '{a}', which is also swept; sweep one of them")
    lengths = {k: len(v) for k, v in zipped.items()}
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{k} has {n}" for k, n in lengths.items())
        raise CapacityError(f"sweep.zip lists must have equal lengths ({detail}); make them equal or move keys to sweep.product")
    zip_len = next(iter(lengths.values())) if lengths else 1
    size = math.prod(len(v) for v in product.values()) * zip_len
    if size > MAX_POINTS:
        counts = " x ".join(str(len(v)) for v in product.values()) + (f" x {zip_len} (zip)" if zipped else "")
        raise CapacityError(f"sweep: the grid has {size:,} points ({counts}), more than {MAX_POINTS:,}; sweep fewer "
                            f"values or split it into several sweeps")
    points: list[Point] = []
    seen: dict[str, Point] = {}
    for combo in itertools.product(*product.values(), range(zip_len)):
        *values, j = combo
        overrides = dict(zip(product, values))
        overrides.update({k: v[j] for k, v in zipped.items()})
        pid = point_id(overrides)
        if pid in seen:
            p = seen[pid]
            raise CapacityError(f"sweep: the grid lists the point {p.describe()} twice; remove the repeated value")
        p = Point(len(points), pid, overrides)
        seen[pid] = p
        points.append(p)
    return product, zipped, points


def spec_from_dict(data: dict[str, Any], source: str = "scenario") -> SweepSpec:
    """A sweep scenario dict (with its `sweep:` section) -> SweepSpec. Does not validate points."""
    if not isinstance(data, dict):
        raise CapacityError(f"{source}: a scenario is a YAML mapping with deployment and traffic sections")
    if SWEEP_KEY not in data:
        raise CapacityError(f"{source} has no sweep: section; add one, e.g. sweep: {{product: {{traffic.arrival.rate_rps: [1, 2, 4]}}}}")
    base = {k: v for k, v in data.items() if k != SWEEP_KEY}
    product, zipped, points = expand_grid(data[SWEEP_KEY])
    return SweepSpec(source, base, product, zipped, tuple(points))


def load_spec(name_or_path: str) -> SweepSpec:
    """Read a sweep scenario (a shipped name or a path)."""
    path, data = scenario_mod.read_yaml(name_or_path)
    return spec_from_dict(data, str(path))


def point_scenario(base: dict[str, Any], point: Point, source: str = "scenario"):
    """The validated Scenario of one grid point (CapacityError names the point's overrides)."""
    data = scenario_mod.apply_overrides(copy.deepcopy(base), point.set_args())
    return scenario_mod.from_dict(data, f"{source} at point {point.point_id} ({point.describe()})")


def validate_points(spec: SweepSpec) -> None:
    """Check every point before anything runs: the schema, and that the GPU, model and method exist.

    Problems that depend on the combination (a model that does not fit, a method without a draft
    for that target) are results of the sweep: they are recorded in the point's `error` column.
    """
    for p in spec.points:
        sc = point_scenario(spec.base, p, spec.source)
        d = sc.deployment
        try:
            load_gpu(d.gpu)
            load_model(d.model, weight_precision=d.precision, kv_dtype=d.kv_cache_dtype)
            if sc.speculative.method != "none":
                get_method(sc.speculative.method)
        except CapacityError as e:
            raise CapacityError(f"{spec.source} at point {p.point_id} ({p.describe()}): {e}") from None


# ---------------------------------------------------------------------- one point
def run_point(base: dict[str, Any], point: Point, source: str = "scenario") -> dict[str, Any]:
    """Simulate one grid point -> its result row (a CapacityError becomes the row's `error`)."""
    t0 = time.perf_counter()
    row: dict[str, Any] = {"point_id": point.point_id, **point.overrides}
    try:
        result = simulate.run(point_scenario(base, point, source))
    except CapacityError as e:
        row.update(error=str(e), wall_time_s=time.perf_counter() - t0)
        return clean(row)
    row["stable"] = result.stable
    row["num_gpus"] = result.num_gpus
    row.update(flatten_metrics(result.metrics))
    r = result.requests
    steps = int(r["spec_steps"].sum())
    row["spec_mean_accepted_length"] = 1 + float(r["spec_accepted"].sum()) / steps if steps else None
    sb = speculation_by_batch(result) if steps else None
    # where the point's N stops paying (policies.break_even), and its expected one-step speedup there
    row["spec_pays_up_to_running"] = sb["pays_up_to"] if sb else None
    row["spec_step_speedup_at_mean_batch"] = sb.get("speedup_at_batch") if sb else None
    row["error"] = None
    row["wall_time_s"] = time.perf_counter() - t0
    return clean(row)


# ---------------------------------------------------------------------- the results folder
def read_rows(out: Path) -> dict[str, dict[str, Any]]:
    """Complete result lines of a folder, by point_id (the first complete line of a point wins).

    A last line without its newline (a writer killed mid-line) and lines that are not JSON are
    ignored.
    """
    path = Path(out) / RESULTS_FILE
    rows: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return rows
    data = path.read_bytes()
    for line in data.split(b"\n")[:-1]:  # the part after the last newline is incomplete
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("point_id"), str):
            rows.setdefault(row["point_id"], row)
    return rows


def _drop_partial_line(path: Path) -> None:
    """Cut an incomplete last line (from a killed writer) so that appended lines start clean."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        os.truncate(path, data.rfind(b"\n") + 1)


class ResultsWriter:
    """Appends one JSON line per finished point: one write of the whole line, then fsync."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, row: dict[str, Any]) -> None:
        line = (json.dumps(clean(row), allow_nan=False, default=str) + "\n").encode()
        view = memoryview(line)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "ResultsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def manifest(spec: SweepSpec) -> dict[str, Any]:
    return {
        "schema": MANIFEST_SCHEMA,
        "capacity_version": __version__,
        "scenario": spec.name,
        "source": spec.source,
        "scenario_hash": spec.scenario_hash,
        "grid": {"product": spec.product, "zip": spec.zip},
        "keys": spec.keys,
        "points": [{"point_id": p.point_id, "overrides": p.overrides} for p in spec.points],
    }


def _read_manifest(out: Path) -> dict[str, Any] | None:
    path = out / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError:
        raise CapacityError(f"{path} is not valid JSON; delete {out} or use another --out") from None
    if not isinstance(data, dict):
        raise CapacityError(f"{path} is not a sweep manifest; delete {out} or use another --out")
    return data


def check_out(spec: SweepSpec, out: Path, resume: bool) -> set[str]:
    """Check the output folder (nothing is written); return the point ids already done there."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CapacityError(f"--out {out} is a file; give a folder")
    non_empty = out.is_dir() and any(out.iterdir())
    if non_empty and not resume:
        raise CapacityError(f"{out} already holds results; add --resume to continue that sweep or choose another --out")
    if not non_empty:
        return set()
    old = _read_manifest(out)
    if old is None:
        raise CapacityError(f"{out} is not a sweep results folder (no {MANIFEST_FILE}); use another --out")
    if old.get("scenario_hash") != spec.scenario_hash:
        raise CapacityError(f"results in {out} come from a different scenario; use another --out or delete it")
    return set(read_rows(out)) & {p.point_id for p in spec.points}


def start_out(spec: SweepSpec, out: Path) -> None:
    """Create the folder, write the manifest (atomically) and cut a partial last result line."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _drop_partial_line(out / RESULTS_FILE)
    tmp = out / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(clean(manifest(spec)), indent=2, default=str) + "\n")
    os.replace(tmp, out / MANIFEST_FILE)


def _ordered_columns(rows: Iterable[dict[str, Any]], first: list[str]) -> list[str]:
    seen: dict[str, None] = dict.fromkeys(first)
    for row in rows:
        seen.update(dict.fromkeys(row))
    last = [c for c in ("error", "wall_time_s") if c in seen]
    return [c for c in seen if c not in last] + last


def ordered_rows(out: Path) -> list[dict[str, Any]]:
    """The folder's result rows, one per grid point of its manifest, in grid order."""
    out = Path(out)
    if not out.is_dir():
        raise CapacityError(f"{out} is not a folder; give the --out folder of a sweep")
    rows = read_rows(out)
    man = _read_manifest(out)
    if man is None:
        if not rows:
            raise CapacityError(f"{out} holds no sweep results ({MANIFEST_FILE}, {RESULTS_FILE}); give the --out folder of a sweep")
        return list(rows.values())
    order = [p["point_id"] for p in man.get("points", [])]
    return [rows[pid] for pid in order if pid in rows]


def load_results(out: str | os.PathLike[str]):
    """A sweep's results as a pandas DataFrame: one row per grid point, in grid order.

    Columns: point_id, the swept keys (dotted names), stable, num_gpus, the flattened metrics
    (ttft_ms_p99, tpot_ms_p90, output_throughput_tok_s_per_gpu, goodput_rps, slo_met, ...), for
    speculative points spec_mean_accepted_length, spec_pays_up_to_running (the most running requests
    per replica at which the point's N still speeds a decode step up) and
    spec_step_speedup_at_mean_batch, error (None, or why the point could not be simulated) and
    wall_time_s.
    """
    out = Path(out)
    rows = ordered_rows(out)
    man = _read_manifest(out) or {}
    columns = _ordered_columns(rows, ["point_id", *man.get("keys", [])])
    return pd.DataFrame(rows, columns=columns).reset_index(drop=True) if rows else pd.DataFrame(columns=columns)


# ---------------------------------------------------------------------- running
@dataclass
class SweepRun:
    spec: SweepSpec
    out: Path
    ran: int
    skipped: int
    wall_time_s: float

    def rows(self) -> list[dict[str, Any]]:
        return ordered_rows(self.out)


def _collect(futures: list[Any], wait_any: Callable, on_done: Callable[[dict], None]) -> None:
    """Hand each finished point's row to `on_done` as soon as it completes (any order)."""
    try:
        for fut in wait_any(futures):
            on_done(fut.result())
    except BaseException:
        for fut in futures:
            fut.cancel()
        raise


def _dask_client(scheduler: str | None, workers: int, processes: bool):
    try:  # dask.distributed takes ~1 s to import: only the dask backend pays it
        from distributed import Client, LocalCluster
    except ImportError:  # pragma: no cover - distributed is a dependency
        raise CapacityError("the dask backend needs dask.distributed: pip install distributed") from None
    if scheduler:
        try:
            return Client(scheduler, timeout=DASK_CONNECT_TIMEOUT_S, set_as_default=False), None
        except (OSError, TimeoutError, ValueError) as e:
            raise CapacityError(f"cannot reach the Dask scheduler at {scheduler} ({e}); start it (dask scheduler) "
                                f"or check --scheduler") from None
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes,
                           dashboard_address=":0", silence_logs=logging.ERROR)
    return Client(cluster, set_as_default=False), cluster


def _submit_dask(spec: SweepSpec, todo: list[Point], client: Any) -> list[Any]:
    tag = spec.scenario_hash[:8]
    return [client.submit(run_point, spec.base, p, spec.source, pure=False,
                          key=f"capacity-sweep-{tag}-{p.point_id}-{os.urandom(4).hex()}")
            for p in todo]


def run_sweep(spec: SweepSpec, out: str | os.PathLike[str], *, workers: int | None = None,
              backend: str = "local", scheduler: str | None = None, resume: bool = False,
              progress: bool = True, dask_processes: bool = True) -> SweepRun:
    """Run every point not yet in `out`, appending each result line as it completes."""
    if backend not in ("local", "dask"):
        raise CapacityError(f"--backend '{backend}': use local or dask")
    if scheduler and backend != "dask":
        raise CapacityError("--scheduler needs --backend dask")
    if workers is not None and workers < 1:
        raise CapacityError(f"--workers {workers}: give 1 or more")
    validate_points(spec)
    out = Path(out)
    done = check_out(spec, out, resume)
    todo = [p for p in spec.points if p.point_id not in done]
    n_workers = max(1, min(workers or os.cpu_count() or 1, max(len(todo), 1)))
    client = cluster = pool = None
    futures: list[Any] = []
    if backend == "dask" and todo:  # connect before writing anything: an unreachable scheduler leaves no folder
        client, cluster = _dask_client(scheduler, n_workers, dask_processes)
    t0 = time.perf_counter()
    try:
        start_out(spec, out)
        if client is not None:
            from distributed import as_completed as dask_completed   # dask only (see _dask_client)

            futures = _submit_dask(spec, todo, client)
            wait_any = lambda fs: dask_completed(fs, loop=client.loop)  # noqa: E731
        elif n_workers > 1 and len(todo) > 1:
            pool = ProcessPoolExecutor(max_workers=n_workers)
            # submitting forks the workers: do it before the progress bar starts its thread
            futures = [pool.submit(run_point, spec.base, p, spec.source) for p in todo]
            wait_any = as_completed
        with ResultsWriter(out / RESULTS_FILE) as writer:
            bar = tqdm(total=len(spec.points), initial=len(spec.points) - len(todo), desc=f"sweep {spec.name}",
                       unit="point", file=sys.stderr, disable=not progress, dynamic_ncols=True)

            def on_done(row: dict[str, Any]) -> None:
                writer.write(row)
                bar.update(1)

            try:
                if futures:
                    _collect(futures, wait_any, on_done)
                else:  # one worker (or one point): in this process
                    for p in todo:
                        on_done(run_point(spec.base, p, spec.source))
            finally:
                bar.close()
    except BaseException:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
            pool = None
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    return SweepRun(spec, out, len(todo), len(spec.points) - len(todo), time.perf_counter() - t0)


# ---------------------------------------------------------------------- command line
def default_out(spec: SweepSpec) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", spec.name).strip("-") or "scenario"
    return Path("reports") / f"sweep-{safe}"


_TABLE = (  # (column, header, format)
    ("stable", "stable", "{}"),
    ("ttft_ms_p99", "TTFT p99 ms", "{:,.0f}"),
    ("tpot_ms_p90", "TPOT p90 ms", "{:.1f}"),
    ("output_throughput_tok_s_per_gpu", "out tok/s/GPU", "{:,.0f}"),
    ("tok_s_per_user_p50", "tok/s/user p50", "{:.1f}"),
    ("goodput_rps", "goodput rps", "{:.2f}"),
    ("slo_met", "SLOs met", "{}"),
)


def _short_names(keys: list[str]) -> dict[str, str]:
    """Column headers for swept keys: the last part of the dotted name where that is unambiguous."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def _cell(value: Any, fmt: str = "{}") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, (dict, list)):
        return yaml_value(value)
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def _table(header: list[str], body: list[list[str]]) -> str:
    # a shorter row (an error message) lets its last cell run past the columns it spans
    widths = [max([len(h)] + [len(r[i]) for r in body if i < len(r) - 1 or len(r) == len(header)])
              for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in body]
    return "\n".join(lines)


def points_table(spec: SweepSpec) -> str:
    names = _short_names(spec.keys)
    body = [[p.point_id, *(_cell(p.overrides[k]) for k in spec.keys)] for p in spec.points]
    return _table(["point_id", *(names[k] for k in spec.keys)], body)


def results_table(spec: SweepSpec, rows: list[dict[str, Any]]) -> str:
    names = _short_names(spec.keys)
    header = ["point_id", *(names[k] for k in spec.keys), *(h for _, h, _ in _TABLE)]
    body = []
    for r in rows:
        cells = [r["point_id"], *(_cell(r.get(k)) for k in spec.keys)]
        if r.get("error"):
            msg = str(r["error"])
            cells.append("error: " + (msg if len(msg) <= 90 else msg[:87] + "..."))
        else:
            cells += [_cell(r.get(col), fmt) for col, _, fmt in _TABLE]
        body.append(cells)
    return _table(header, body)
