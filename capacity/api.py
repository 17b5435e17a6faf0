"""The notebook API: `capacity.simulate`, `capacity.plan`, `capacity.sweep`.

The same library calls as the CLI, returning objects with DataFrames and Plotly figures instead of
printed text. Overrides are keyword arguments whose `__` stands for the dot of a scenario key
(`deployment__gpu="MI355X"` is `--set deployment.gpu=MI355X`), or a `set={"deployment.gpu": "MI355X"}`
mapping; values are Python values.

    import capacity
    sim = capacity.simulate(traffic__arrival__rate_rps=4, deployment__gpu="MI355X")
    sim.metrics_frame()          # one flat row: ttft_ms_p99, tpot_ms_p90, output_throughput_tok_s, ...
    sim.requests                 # one row per request with ttft_ms, tpot_ms, e2e_ms, ...
    sim.comparison()             # the same traffic with and without speculation, side by side
    sim.figures()["latency_cdf"].show()
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from capacity.inputs import scenario as scenario_mod
from capacity.sim import summary
from capacity.sim.metrics import flatten_metrics, per_request_frame
from capacity.sim.simulate import SimulationResult
from capacity.studies import plan as plan_mod
from capacity.studies import sweep as sweep_mod


def _set_args(overrides: Mapping[str, Any], set: Mapping[str, Any] | None) -> list[str]:
    """`--set` items from keyword overrides (`a__b=1` -> `a.b=1`) and a {dotted key: value} mapping.
    JSON is YAML, so the values go through the CLI's own parser (one rule for both)."""
    items = {**{k.replace("__", "."): v for k, v in overrides.items()}, **dict(set or {})}
    return [f"{key}={json.dumps(value)}" for key, value in items.items()]


@dataclass
class Simulation:
    """One simulated scenario (and, with speculation on, the same traffic without it)."""

    result: SimulationResult

    @property
    def metrics(self) -> dict[str, Any]:
        """The `vllm bench serve` statistics, as `capacity simulate --json` prints them under `metrics`."""
        return self.result.metrics

    def metrics_frame(self) -> pd.DataFrame:
        """The metrics as one flat row (ttft_ms_p99, tpot_ms_p90, ...), the columns of a sweep's results."""
        return pd.DataFrame([flatten_metrics(self.metrics)])

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request: lengths, times and the latency columns (ttft_ms, tpot_ms, e2e_ms, ...)."""
        return per_request_frame(self.result.requests)

    def comparison(self) -> pd.DataFrame:
        """Flat metrics with speculation (this run) and without it (the same traffic and seed), one
        column each; only the first column when speculation is off."""
        cols = {self.label: flatten_metrics(self.metrics)}
        if self.result.comparison is not None:
            cols["no speculation"] = flatten_metrics(self.result.comparison.metrics)
        return pd.DataFrame(cols)

    @property
    def label(self) -> str:
        spec = self.result.scenario.speculative
        return "no speculation" if spec.method == "none" or not spec.num_speculative_tokens else \
            f"{spec.method} N={spec.num_speculative_tokens}"

    def summary(self) -> str:
        """The text `capacity simulate` prints."""
        return summary.simulation_summary(self.result)

    def figures(self) -> dict[str, Any]:
        """The Plotly figures the report draws for this run, by name (plotly is imported here)."""
        from capacity.report import figures   # plotly: only when figures are asked for

        runs = {self.label: self.requests}
        if self.result.comparison is not None:
            runs["no speculation"] = per_request_frame(self.result.comparison.requests)
        name = self.result.scenario.name
        out = {"latency_cdf": figures.latency_cdf_figure(runs, self.result.scenario.slo, source=f"scenario {name}")}
        if self.result.requests["spec_steps"].sum() > 0:
            out["acceptance"] = figures.acceptance_figure(self.result.requests, source=f"scenario {name}")
        sb = self.result.extras.get("speculation_by_batch")
        if sb:
            out["speculation_by_load"] = figures.speculation_by_load_figure(sb, source=f"scenario {name}")
        return out

    def write(self, out: str | Path) -> Path:
        """The folder `capacity simulate --out` writes (result.json, requests.csv, scenario.yaml)."""
        summary.write_simulation(self.result, summary.simulation_payload(self.result), Path(out))
        return Path(out)


def simulate(scenario: str | Path | None = None, *, seed: int | None = None, compare: bool = True,
             set: Mapping[str, Any] | None = None, **overrides: Any) -> Simulation:
    """Simulate a scenario (a shipped name, a path, or None for the built-in default) with overrides."""
    sc = scenario_mod.load(None if scenario is None else str(scenario), _set_args(overrides, set))
    if seed is not None:
        sc.simulation.seed = seed
    return Simulation(summary.run_with_comparison(sc, compare=compare))


def plan(scenario: str | Path | None = None, *, workers: int | None = None, progress: bool = False,
         set: Mapping[str, Any] | None = None, **overrides: Any) -> plan_mod.PlanResult:
    """`capacity plan`: the cheapest deployment meeting the scenario's SLOs at its plan.target_rate_rps.
    The result's `to_json()` is plan.json; `plan_mod.summary_text(result)` is the printed text."""
    return plan_mod.run(None if scenario is None else str(scenario), _set_args(overrides, set), workers=workers,
                        progress=progress)


def sweep(scenario: str | Path, out: str | Path, *, workers: int | None = None, resume: bool = False,
          progress: bool = False) -> pd.DataFrame:
    """`capacity sweep`: every point of the scenario's `sweep:` grid, written to `out` (resumable);
    returns the results as a DataFrame (`capacity.load_results(out)`)."""
    spec = sweep_mod.load_spec(str(scenario))
    sweep_mod.run_sweep(spec, out, workers=workers, resume=resume, progress=progress)
    return sweep_mod.load_results(out)
