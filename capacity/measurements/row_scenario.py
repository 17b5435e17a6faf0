"""A measured row as the scenario that reproduces it.

A serving row (schema of serving_vllm.csv) becomes a scenario (`row_scenario`): the row's GPU,
model, precision and TP; a closed loop of `concurrency_or_qps` users (InferenceX) or Poisson arrivals
at `concurrency_or_qps` req/s; prompts and outputs uniform in the range the source's benchmark
client drew its random lengths from (`clients.random_lengths`), or, for a vLLM --save-detailed
result, the run's own request stream (`row_stream`); and the serve flags its series' script passed
that the row does not carry (KV-cache dtype, batched-token budget, async scheduling, memory
utilization, max-num-seqs: `clients.serve_recipe`; `max_num_seqs: concurrency` is the row's closed-loop
concurrency). A row that cannot be modelled says why.
A speculative row is simulated with its stated method, N and mean accepted length (`row_speculation`).

A speculative-speedup row (schema of seed_spec_decode.csv) gives the scenario's `speculative`
section with its own measured acceptance (`speculative_config`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from capacity.errors import CapacityError
from capacity.inputs.hardware import load_gpu, looks_like_path
from capacity.inputs.models import load_model
from capacity.inputs.traffic import RequestStream, TrafficConfig, open_loop_arrivals
from capacity.measurements.clients import async_scheduling, client_of, random_lengths, serve_recipe
from capacity.measurements.schemas import (PREDICTED, draft_checkpoint, marginal_rates, method_name, model_aliases,
                                           parse_float, serving_draft, serving_method, serving_precision)
from capacity.spec.acceptance import iid_alpha_for_length

PROMPTS_PER_USER = 10      # InferenceX runs 10 × concurrency prompts per point
POISSON_REQUESTS = 400     # assumed for Poisson rows that do not state their prompt count
# A serve_recipes.yaml `set` value of engine.max_num_seqs that stands for the row's own closed-loop
# concurrency (a script's `--max-num-seqs $CONC`)
MAX_NUM_SEQS_CONCURRENCY = "concurrency"

# Skip reasons no simulator could get past: the row measures nothing it predicts, or states no load.
NOTHING_TO_PREDICT = "no measured column the simulator predicts"
LOAD_NOT_STATED = "tp, isl, osl or load not stated"
# A closed loop of C users keeps C requests in flight, so by Little's law (L = lambda W) its request
# rate times its mean E2E latency is C, less only the ramp at its ends (the shipped InferenceX rows:
# median 0.98 C with their mean output length). A row far below it lost requests (failed or timed
# out, which `vllm bench serve` leaves out of every rate): its rates are not the stated load's.
LITTLE_MIN_FRACTION = 0.5   # assumed: far below the ramp-only shortfall (shipped rows 0.98), far above the 6 lost ones (0.04-0.16)
LITTLE_VIOLATED = ("closed loop whose rate x E2E holds under half its concurrency in flight (Little's law): "
                   "requests failed or timed out, so its rates are not that load's")


def little_in_flight(row: dict[str, Any], mean_output_tokens: float, num_gpus: float | None = None) -> float:
    """Requests in flight a closed-loop row's own figures imply: output rate / mean output length x E2E
    (the median E2E where that is what the row states; TTFT + (output - 1) x TPOT without one); NaN
    where a figure is missing. The rate is output_tok_s_per_gpu x `num_gpus`, the GPUs that served
    the row (`serving_gpus`), where given: InferenceX's output_tok_s_total is per GPU x its num_gpus,
    which for expert-parallel rows counts tp x ep GPUs, 4-8x the ones that ran."""
    total = parse_float(row.get("output_tok_s_per_gpu")) * num_gpus if num_gpus else float("nan")
    if math.isnan(total):
        total = parse_float(row.get("output_tok_s_total"))
    if math.isnan(total):
        total = parse_float(row.get("output_tok_s_per_gpu")) * parse_float(row.get("num_gpus"))
    e2e_ms = parse_float(row.get("e2e_ms"))
    if math.isnan(e2e_ms):
        e2e_ms = parse_float(row.get("ttft_ms")) + (mean_output_tokens - 1) * parse_float(row.get("tpot_ms"))
    return total / mean_output_tokens * e2e_ms / 1000.0
SPEC_WITHOUT_ACCEPTANCE = ("speculative row needs num_spec_tokens and acceptance_length "
                           "(the drafter's mean accepted length) to be predicted")
SPEC_NOT_FITTED = "speculative rows are not used to fit the serving efficiencies"


def _is_true(v: Any) -> bool:
    return str(v).strip().lower() in ("true", "1", "yes")


def row_speculation(row: dict[str, Any]) -> tuple[dict | None, str | None]:
    """The `speculative` section of a row that states its method, N and mean acceptance length (an
    i.i.d. rate with that mean: (1 - a^(N+1)) / (1 - a) = acceptance_length), or (None, why not)."""
    label = str(row.get("spec_method", ""))
    n, length = parse_float(row.get("num_spec_tokens")), parse_float(row.get("acceptance_length"))
    if not (n >= 1 and length >= 1):
        return None, SPEC_WITHOUT_ACCEPTANCE
    try:
        alpha = iid_alpha_for_length(length, int(n))
    except CapacityError as e:
        return None, str(e)
    spec = {"method": serving_method(label), "num_speculative_tokens": int(n),
            "acceptance": {"model": "iid", "alpha": round(alpha, 6)}}
    draft = serving_draft(label)[0]
    if draft:
        spec["draft"] = model_aliases().get(draft, draft)
    return spec, None


def row_scenario(row: dict[str, Any], prompts_per_user: int = PROMPTS_PER_USER,
                 speculative: bool = True) -> tuple[dict | None, str | None]:
    """The scenario dict that reproduces a measured row, or (None, reason it cannot be modelled).
    `speculative=False` (calibration) refuses speculative rows."""
    if "vllm" not in str(row.get("framework", "")).lower():
        return None, f"framework '{row.get('framework')}' is not modelled (the simulator mimics vLLM v1)"
    if _is_true(row.get("disagg")):
        return None, "disaggregated prefill/decode serving is not modelled"
    if _is_true(row.get("dp_attention")):
        return None, "data-parallel attention is not modelled"
    ep = parse_float(row.get("ep"))
    expert_parallel = not math.isnan(ep) and ep > 1
    if expert_parallel and ep != parse_float(row.get("tp")):
        return None, "expert parallelism over other GPUs than the tensor-parallel ones is not modelled (EP = TP only)"
    spec = None
    if str(row.get("spec_method", "none")).strip().lower() not in ("", "none", "nan"):
        if not speculative:
            return None, SPEC_NOT_FITTED
        spec, reason = row_speculation(row)
        if spec is None:
            return None, reason
    if not any(not math.isnan(parse_float(row.get(c))) for c in PREDICTED):
        return None, NOTHING_TO_PREDICT
    try:
        gpu = load_gpu(str(row["gpu"]))
    except CapacityError:
        return None, f"no hardware profile for GPU '{row['gpu']}'"
    name = model_aliases().get(str(row["model"]), str(row["model"]))
    precision = serving_precision(row.get("precision", ""))
    try:
        load_model(name, weight_precision=precision)
    except CapacityError:
        return None, f"unknown model '{row['model']}'"
    tp, isl, osl = parse_float(row["tp"]), parse_float(row["isl"]), parse_float(row["osl"])
    load = parse_float(row["concurrency_or_qps"])
    if any(math.isnan(x) for x in (tp, isl, osl, load)):
        return None, LOAD_NOT_STATED
    num_gpus = parse_float(row.get("num_gpus"))
    if expert_parallel and num_gpus == tp * ep:
        # InferenceX's EP rows give num_gpus = tp x ep although EP runs over the TP GPUs: their
        # per-GPU rates are per tp GPUs (per-user rate x concurrency / tp = output_tok_s_per_gpu
        # within 1-6 % on all 51 shipped rows, as num_gpus does on the TP-only rows)
        num_gpus = tp
    replicas = int(round(num_gpus / tp)) if not math.isnan(num_gpus) and num_gpus > tp else 1
    load_type = str(row["load_type"]).lower()
    exact = _lens(row)
    if exact is not None:   # vllm bench serve --save-detailed: the run's own lengths (replayed by row_stream)
        ins, outs = exact
        lengths = {"input_tokens": {"dist": "uniform", "low": int(ins.min()), "high": int(ins.max())},
                   "output_tokens": {"dist": "uniform", "low": int(outs.min()), "high": int(outs.max())}}
    else:
        lengths = random_lengths(row, isl, osl)
    num_prompts = parse_float(row.get("num_prompts"))
    if math.isnan(num_prompts):
        num_prompts = parse_float(client_of(row).get("num_prompts"))
    if exact is not None:
        num_prompts = float(len(exact[0]))
    if "rate_and_concurrency" in load_type or "burst" in load_type:
        return None, f"load type '{row['load_type']}' is not modelled"
    if "closed" in load_type or "concurrency" in load_type:
        c = int(load)
        out = lengths["output_tokens"]
        in_flight = little_in_flight(row, (out["low"] + out["high"]) / 2.0 if out.get("dist") == "uniform"
                                     else float(out.get("value", osl)), num_gpus if num_gpus > 0 else None)
        if in_flight < LITTLE_MIN_FRACTION * c:
            return None, LITTLE_VIOLATED
        n = int(num_prompts) if num_prompts > 0 else prompts_per_user * c
        traffic = {"arrival": {"process": "closed_loop", "concurrency": c}, "num_requests": n}
    elif "poisson" in load_type or "gamma" in load_type:
        burst = parse_float(row.get("burstiness"))
        arrival = ({"process": "gamma", "rate_rps": load, "burstiness": burst}
                   if "gamma" in load_type and burst > 0 else {"process": "poisson", "rate_rps": load})
        traffic = {"arrival": arrival, "num_requests": int(num_prompts) if num_prompts > 0 else POISSON_REQUESTS}
    else:
        return None, f"load type '{row['load_type']}' is not modelled"
    traffic["classes"] = [{"name": "random", **lengths}]
    scenario = {
        "name": f"{row.get('file', 'row')}:{row.get('row', '')}",
        # a row measured on a profile YAML (e.g. `capacity calibrate --out`) keeps its path: the name
        # inside the file would load the shipped profile of that GPU instead
        "deployment": {"gpu": str(row["gpu"]).strip() if looks_like_path(str(row["gpu"]).strip()) else gpu.name,
                       "model": name, "precision": precision,
                       "tensor_parallel_size": int(tp), "replicas": replicas,
                       **({"expert_parallel": True} if expert_parallel else {})},
        "traffic": traffic,
    }
    engine = {k: int(parse_float(row[k])) for k in ("max_num_batched_tokens", "max_num_seqs")
              if k in row and parse_float(row[k]) > 0}
    if not async_scheduling(row):
        engine["async_scheduling"] = False
    if engine:
        scenario["engine"] = engine
    for key, value in serve_recipe(row).items():    # the series' serve flags (serve_recipes.yaml)
        if key == "engine.max_num_seqs" and value == MAX_NUM_SEQS_CONCURRENCY:
            # --max-num-seqs $CONC: the closed loop's concurrency; an open-loop row has none, so the key stays out
            if traffic["arrival"]["process"] != "closed_loop":
                continue
            value = int(traffic["arrival"]["concurrency"])
        section, field = key.split(".", 1)
        scenario.setdefault(section, {})[field] = value
    if spec:
        scenario["speculative"] = spec
    return scenario, None


def _lens(row: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """The per-request (input, output) lengths a vLLM --save-detailed result recorded, if any."""
    ins, outs = row.get("input_lens"), row.get("output_lens")
    if isinstance(ins, (list, np.ndarray)) and isinstance(outs, (list, np.ndarray)) and len(ins) and len(ins) == len(outs):
        return np.asarray(ins, dtype=np.int64), np.maximum(np.asarray(outs, dtype=np.int64), 1)
    return None


def row_stream(row: dict[str, Any], scenario: dict[str, Any]):
    """The exact request stream of a row with recorded per-request lengths, else None (the scenario draws it).

    Closed loop: the lengths in send order. Open loop: the recorded send times (`start_times`) when
    present, else vLLM's gamma/Poisson gaps drawn with the scenario's seed and rescaled as vLLM does.
    """
    exact = _lens(row)
    if exact is None:
        return None
    ins, outs = exact
    arrival_cfg = scenario["traffic"]["arrival"]
    if arrival_cfg["process"] == "closed_loop":
        arrival = np.full(len(ins), np.nan)
        conc = int(arrival_cfg["concurrency"])
    else:
        conc = None
        starts = row.get("start_times")
        if isinstance(starts, (list, np.ndarray)) and len(starts) == len(ins):
            arrival = np.asarray(starts, dtype=float) - float(np.min(starts))
            order = np.argsort(arrival, kind="stable")
            arrival, ins, outs = arrival[order], ins[order], outs[order]
        else:
            cfg = TrafficConfig.model_validate(scenario["traffic"])
            rng = np.random.default_rng(np.random.SeedSequence(0).spawn(2)[0]).spawn(3)[0]
            arrival = open_loop_arrivals(cfg.arrival, len(ins), None, rng)
    return RequestStream(arrival_s=arrival.astype(float), prompt_tokens=ins, output_tokens=outs,
                         class_index=np.zeros(len(ins), dtype=np.int64), class_names=["recorded"], concurrency=conc)


def speculative_config(row: dict[str, Any], overrides: dict[str, float] | None = None) -> dict[str, Any]:
    """The scenario's `speculative` section for a speculative-speedup row (its own acceptance as a chain)."""
    method = method_name(row["method"])
    n = int(parse_float(row["num_speculative_tokens"]))
    rates = marginal_rates(row["per_position_acceptance"])
    if len(rates) < n:
        raise CapacityError(f"{row.get('target')} {row.get('method')} N={n}: per_position_acceptance has "
                            f"{len(rates)} rates, need {n}")
    cfg: dict[str, Any] = {"method": method, "num_speculative_tokens": n, "draft": draft_checkpoint(row),
                           "acceptance": {"model": "chain", "rates": rates[:n], "basis": "marginal"}}
    if overrides:
        cfg["overrides"] = dict(overrides)
    return cfg
