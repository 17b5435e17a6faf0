"""What `capacity simulate` prints and writes: a short human summary, a JSON payload, files."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from capacity.errors import CapacityError
from capacity.inputs.scenario import Scenario, Speculative
from capacity.inputs.step_cost_fidelity import expected_error
from capacity.sim import simulate
from capacity.sim.metrics import parse_slos
from capacity.sim.simulate import SimulationResult
from capacity.spec.policies import break_even, decode_step_time
from capacity.util.jsonio import write_json


def run_with_comparison(sc: Scenario, compare: bool = True) -> SimulationResult:
    """`capacity simulate`: the scenario, and with speculation on (unless `compare` is False) the same
    traffic (same seed) without it, to show what speculation changes (`result.comparison`)."""
    result = simulate.run(sc)
    if compare and sc.speculative.method != "none" and sc.speculative.num_speculative_tokens > 0:
        baseline = simulate.run(sc.model_copy(update={"speculative": Speculative()}))
        result.extras["without_speculation"] = {"metrics": baseline.metrics, "stable": baseline.stable}
        result.extras["speculation_by_batch"] = speculation_by_batch(result)
        result.comparison = baseline
    return result


def simulation_payload(result: SimulationResult) -> dict[str, Any]:
    sc = result.scenario
    return {
        "scenario": sc.model_dump(mode="json"),
        "stable": result.stable,
        "num_gpus": result.num_gpus,
        "metrics": result.metrics,
        "memory": result.deployed.memory,
        "step_breakdown_s": result.step_breakdown_s,
        # the error the step cost carries for this model and TP size on this GPU (the profile's cross-validation)
        "step_cost_error": expected_error(result.deployed.gpu, result.deployed.model.name,
                                          sc.deployment.tensor_parallel_size),
        # no wall-clock figures here: two runs of one scenario and seed write the same bytes (the text
        # summary says how long the run took)
        "simulation": {
            "num_steps": result.num_steps,
            "sim_time_s": result.sim_time_s,
        },
        **result.extras,
    }


def _lat(m: dict[str, Any], key: str) -> str:
    s = m.get(key) if isinstance(m.get(key), dict) else {}
    vals = [s.get(q) for q in ("mean", "p50", "p90", "p99")]
    return "  ".join(f"{_num(v, '9.1f'):>9}" for v in vals)


def _num(value: Any, fmt: str) -> str:
    """`value` formatted, or '-' when the run produced no such number (e.g. nothing finished)."""
    if value is None or isinstance(value, (dict, list, str)):
        return "-"
    try:
        if fmt.endswith("d") and isinstance(value, float):
            value = int(value)
        return format(value, fmt)
    except (TypeError, ValueError, OverflowError):
        return "-"


def _get(m: dict[str, Any], key: str, stat: str | None = None) -> Any:
    v = m.get(key)
    if stat is not None:
        v = v.get(stat) if isinstance(v, dict) else None
    return v


def simulation_summary(result: SimulationResult) -> str:
    sc, m = result.scenario, result.metrics
    d = sc.deployment
    dep = result.deployed
    lines = [
        f"Scenario   {sc.name}: {dep.model.name} ({dep.model.weight_precision}) on {d.replicas} replica(s) × TP{d.tensor_parallel_size} {dep.gpu.name}"
        f" = {result.num_gpus} GPU(s); KV cache {dep.memory['kv_cache_tokens']:,} tokens per replica",
    ]
    if sc.speculative.method != "none":
        lines.append(f"Speculation {sc.speculative.method}, N = {sc.speculative.num_speculative_tokens}")
    verdict = "stable" if m["stable"] else "UNSTABLE (the queue grows without bound: numbers below are not steady-state)"
    lines += [
        f"Result     {verdict}; {_num(m.get('completed'), 'd')}/{_num(m.get('num_requests'), 'd')} requests in "
        f"{_num(m.get('duration_s'), '.1f')} s"
        + (f"; {m['failed']} more refused (prompt + output above max_model_len), as vllm bench serve's failed"
           if m.get("failed") else ""),
        f"Throughput {_num(m.get('request_throughput_rps'), '.2f')} req/s, {_num(m.get('output_throughput_tok_s'), ',.0f')} "
        f"output tok/s ({_num(m.get('output_throughput_tok_s_per_gpu'), ',.0f')} per GPU), "
        f"{_num(m.get('total_throughput_tok_s'), ',.0f')} total tok/s",
        f"{'':10} {'mean':>9}  {'p50':>9}  {'p90':>9}  {'p99':>9}",
        f"TTFT ms    {_lat(m, 'ttft_ms')}",
        f"TPOT ms    {_lat(m, 'tpot_ms')}",
        f"ITL ms     {_lat(m, 'itl_ms')}",
        f"E2E ms     {_lat(m, 'e2e_ms')}",
        f"Queue ms   {_lat(m, 'queue_delay_ms')}",
        f"Per user   {_num(_get(m, 'tok_s_per_user', 'p50'), '.1f')} tok/s (median request), "
        f"{_num(_get(m, 'tok_s_per_user', 'p10'), '.1f')} tok/s (p10)",
        f"KV cache   mean {_num(_get(m, 'kv_utilisation', 'mean'), '.0%')}, max "
        f"{_num(_get(m, 'kv_utilisation', 'max'), '.0%')}; preemptions {_num(m.get('preemptions'), 'd')}",
    ]
    pc = m.get("prefix_cache")
    if pc:
        per = [r["prefix_cache_hit_rate"] for r in pc.get("per_replica") or []]
        lines.append(f"Prefix     {pc['prefix_cache_hit_rate']:.0%} of prompt tokens found cached "
                     f"({pc['prefix_cache_hits_tokens']:,} of {pc['prefix_cache_queries_tokens']:,})"
                     + (f"; per replica {', '.join(f'{v:.0%}' for v in per)}" if len(per) > 1 else ""))
    total = sum(result.step_breakdown_s.values()) or 1.0
    parts = ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(result.step_breakdown_s.items(), key=lambda kv: -kv[1]) if v > 0)
    lines.append(f"Step time  {parts}")
    # how far the step cost can be trusted for this model and TP size on this GPU (the profile's cross-validation)
    err = expected_error(dep.gpu, dep.model.name, d.tensor_parallel_size)
    lines += textwrap.wrap("Step cost  " + err["in_words"], width=110, subsequent_indent=" " * 11, break_on_hyphens=False)
    if m.get("slo"):
        checks = "; ".join(f"{s['slo']} → {_achieved(s)} {'ok' if s['met'] else 'MISSED'}" for s in m["slo"])
        lines.append(f"SLOs       {checks}; goodput {_num(m.get('goodput_rps') or 0, '.2f')} req/s")
    if m.get("per_class"):
        lines += per_class_lines(m["per_class"])
    if result.comparison is not None:
        lines += ["", comparison_table(result.comparison, result)]
        sb = result.extras.get("speculation_by_batch") or speculation_by_batch(result)
        if sb:
            lines += speculation_lines(sb, load="this run's mean")
    speed = result.sim_time_s / result.wall_time_s if result.wall_time_s > 0 else float("inf")
    lines.append(f"Simulated  {result.sim_time_s:.0f} s of serving in {result.wall_time_s:.2f} s ({speed:,.0f}× real time, {result.num_steps:,} engine steps)")
    return "\n".join(lines)


def _achieved(row: dict[str, Any]) -> str:
    """An SLO row's achieved value with its unit, in the unit the SLO was written in."""
    try:
        slo = parse_slos(str(row["slo"]))[0]
    except CapacityError:                       # a row not written by parse_slos: plain ms or tok/s
        return "n/a" if row.get("achieved") is None else format(row["achieved"], ".1f")
    return slo.display(row.get("achieved"))


PER_CLASS_COLUMNS = (
    ("TTFT p50/p99 ms", "ttft_ms", ("p50", "p99"), ",.0f"),
    ("TPOT p50/p90 ms", "tpot_ms", ("p50", "p90"), ".1f"),
    ("E2E p50/p90 ms", "e2e_ms", ("p50", "p90"), ",.0f"),
)


def per_class_lines(per_class: dict[str, dict[str, Any]]) -> list[str]:
    """A compact latency table with one row per request class (`metrics["per_class"]`); with SLOs
    also each class's goodput and whether the SLOs that name it are met (the SLOs line above
    has each SLO's achieved value)."""
    width = max(10, *(len(str(c)) for c in per_class))
    head = f"{'Per class':{width}} {'completed':>10}  " + "  ".join(f"{h:>17}" for h, _, _, _ in PER_CLASS_COLUMNS)
    judged = any(b.get("goodput_rps") is not None for b in per_class.values())
    if judged:
        head += f"  {'goodput req/s':>13}  {'class SLOs':>10}"
    out = [head]
    for name, b in per_class.items():
        cells = [" / ".join(_num(_get(b, key, st), fmt) for st in stats) for _, key, stats, fmt in PER_CLASS_COLUMNS]
        row = f"{str(name):{width}} {_num(b.get('completed'), 'd'):>10}  " + "  ".join(f"{c:>17}" for c in cells)
        if judged:
            verdict = {True: "met", False: "MISSED"}.get(b.get("slo_met"), "-")   # "-": no SLO names the class
            row += f"  {_num(b.get('goodput_rps'), '.2f'):>13}  {verdict:>10}"
        out.append(row)
    return out


# "steady.<key>": the rate over the steady window (metrics.steady_window: after the warm-up, up to the last
# arrival), the offered load's rate; the whole-run rate of conversations is diluted by their tail
COMPARISON_ROWS = (
    ("output tok/s per GPU (steady)", "steady.output_throughput_tok_s_per_gpu", None, "{:,.0f}"),
    ("TTFT p50 / p99 ms", "ttft_ms", ("p50", "p99"), "{:,.0f}"),
    ("TPOT p50 / p90 ms", "tpot_ms", ("p50", "p90"), "{:.1f}"),
    ("E2E p50 / p90 ms", "e2e_ms", ("p50", "p90"), "{:,.0f}"),
    ("tok/s per user p50 / p10", "tok_s_per_user", ("p50", "p10"), "{:.1f}"),
    ("goodput req/s (steady)", "steady.goodput_rps", None, "{:.2f}"),
)


def _metric(m: dict[str, Any], key: str) -> Any:
    if key.startswith("steady."):
        return (m.get("steady") or {}).get(key[len("steady."):])
    return m.get(key)


def comparison_metrics(m: dict[str, Any]) -> dict[str, Any]:
    """The metrics `metrics_table` shows (a small JSON-able subset of a run's metrics)."""
    return {key: _metric(m, key) for _, key, _, _ in COMPARISON_ROWS}


def metrics_table(title: str, columns: list[tuple[str, dict[str, Any]]], width: int = 22) -> list[str]:
    """Runs side by side, one column per (heading, metrics)."""

    def cell(m, key, stats, fmt):
        v = m.get(key) if key in m else _metric(m, key)
        if stats:
            vals = [v.get(s) if v else None for s in stats]
            return " / ".join(_num(x, fmt[2:-1]) for x in vals)
        return _num(v, fmt[2:-1])

    out = [f"{title:28} " + " ".join(f"{h:>{width}}" for h, _ in columns)]
    for label, key, stats, fmt in COMPARISON_ROWS:
        out.append(f"{label:28} " + " ".join(f"{cell(m, key, stats, fmt):>{width}}" for _, m in columns))
    return out


def comparison_table(off: SimulationResult, on: SimulationResult) -> str:
    """Side by side: the same traffic without and with speculative decoding."""
    sp = on.scenario.speculative
    out = metrics_table("Speculative decoding effect",
                        [("without", off.metrics), (f"{sp.method} N={sp.num_speculative_tokens}", on.metrics)])
    r = on.request_columns
    if r["spec_steps"].sum():
        out.append(f"{'mean accepted length':28} {'1.00':>22} {1 + r['spec_accepted'].sum() / r['spec_steps'].sum():>22.2f}")
    return "\n".join(out)


def write_simulation(result: SimulationResult, payload: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "result.json", payload)
    result.requests.to_csv(out / "requests.csv", index=False)
    (out / "scenario.yaml").write_text(yaml.safe_dump(result.scenario.model_dump(mode="json"), sort_keys=False))


def speculation_by_batch(res) -> dict[str, Any] | None:
    """For a simulated speculative deployment: up to how many running requests its N pays
    (`policies.break_even` at the run's step-weighted mean decode context), the expected one-step
    speedup at one request and at the run's mean batch, and the best N there."""
    spec = res.deployed.speculation
    n = spec.num_speculative_tokens
    if n <= 0 or spec.acceptance is None:
        return None
    req = res.request_columns
    out_tok = np.asarray(req["output_tokens"], dtype=float)
    if out_tok.sum() <= 0:
        return None
    # a decoding request's context grows from its prompt to prompt + output: weight by decode steps
    context = float(np.sum(out_tok * (np.asarray(req["prompt_tokens"], dtype=float) + out_tok / 2)) / out_tok.sum())
    running = (res.metrics.get("running") or {}).get("mean")
    step = decode_step_time(res.deployed.cost, spec.draft_cost)
    return break_even(step, spec.acceptance.expected_tokens, n, context, res.deployed.limits.max_num_seqs,
                      at_batch=running if running and running >= 1 else None)


def speculation_lines(sb: dict[str, Any], load: str = "the planned mean") -> list[str]:
    """'speculation: N=7 pays up to 123 running requests per replica, off above ...' for the plan summary."""
    n, limit = sb["num_speculative_tokens"], sb["pays_up_to"]
    if limit >= sb["max_batch"]:
        head = f"N={n} pays at every batch size up to max_num_seqs ({sb['max_batch']})"
    elif limit == 0:
        head = f"N={n} does not pay even for one request"
    else:
        head = (f"N={n} pays up to {limit} running requests per replica, off above "
                f"(speculative.policy {{kind: off_above, max_batch_size: {limit}}})")
    tail = f"one decode step {sb['speedup_at_1']:.2f}x at 1 request"
    if sb.get("at_batch"):
        tail += (f", {sb['speedup_at_batch']:.2f}x at {load} of {sb['at_batch']} running "
                 f"(best N there: {sb['best_n_at_batch']})")
    return ["speculation: " + head, f"             {tail}; mean decode context {sb['mean_context_tokens']:,.0f} tokens"]
