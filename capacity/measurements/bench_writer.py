"""Write a simulated run as a `vllm bench serve --save-result [--save-detailed]` JSON.

The keys, their order and their definitions are those of vLLM's `vllm/benchmarks/serve.py`
(commit 009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1): `main_async` writes date, endpoint_type,
backend, label, model_id, tokenizer_id, num_prompts, the --metadata pairs, request_rate ("inf" when
unlimited), burstiness, max_concurrency; `benchmark()` adds duration, completed, failed, token
totals, throughputs, the per-request lists, and `{mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms`
computed as `calculate_metrics` does (TPOT = (latency - ttft) / (output_len - 1) over requests
with more than one output token; numpy mean/median/std/percentile). Without `detailed` the
per-request lists vLLM drops (input_lens, output_lens, start_times, ttfts, itls, generated_texts,
errors) are left out; `latencies` and `queue_times` stay, as in vLLM.

Used to test the readers and calibration against a known configuration (a round trip): the
simulator's statistics are written exactly; the per-request `itls` lists are the request's decode
time split evenly over its output tokens (the simulator pools chunk gaps over requests, so a
per-request split is not recorded), while the ITL statistics come from the pooled gaps, as vLLM's.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from capacity.sim.simulate import SimulationResult


def _stats(values_s: np.ndarray, name: str, percentiles: tuple[float, ...]) -> dict[str, float]:
    v = np.asarray(values_s, dtype=float)
    v = v if len(v) else np.zeros(1)          # vLLM: np.mean(x or 0)
    out = {f"mean_{name}_ms": float(np.mean(v) * 1e3), f"median_{name}_ms": float(np.median(v) * 1e3),
           f"std_{name}_ms": float(np.std(v) * 1e3)}
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(v, p) * 1e3)
    return out


def result_dict(result: SimulationResult, model_id: str, *, request_rate: float | str = "inf",
                burstiness: float = 1.0, max_concurrency: int | None = None, metadata: dict[str, Any] | None = None,
                detailed: bool = True, percentiles: tuple[float, ...] = (99,), date: datetime | None = None,
                backend: str = "vllm") -> dict[str, Any]:
    """The JSON object `vllm bench serve` would have saved for this simulated run."""
    req = result.requests
    done = req[req["finish_s"].notna()]
    arrival = done["arrival_s"].to_numpy(float)
    ttft = done["first_token_s"].to_numpy(float) - arrival
    latency = done["finish_s"].to_numpy(float) - arrival
    ins = done["prompt_tokens"].to_numpy(int)
    outs = done["output_tokens"].to_numpy(int)
    multi = outs > 1
    tpot = (latency[multi] - ttft[multi]) / (outs[multi] - 1)
    rec = [r.recorder for r in result.cluster.replicas]
    pooled_itl = np.concatenate([c for r in rec for c in r.itl_chunks]) if any(r.itl_chunks for r in rec) else np.zeros(0)
    start = float(np.nanmin(req["arrival_s"]))
    duration = float(np.nanmax(done["finish_s"])) - start
    itls = [[float((lat - tt) / (o - 1))] * int(o - 1) if o > 1 else []
            for lat, tt, o in zip(latency, ttft, outs)]
    # peak concurrency, as calculate_metrics: sweep over [start, start + latency)
    events = sorted([(a, 1) for a in arrival] + [(a + lat, -1) for a, lat in zip(arrival, latency)],
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    token_times = np.concatenate([a + tt + np.arange(o) * ((lat - tt) / max(o - 1, 1))
                                  for a, tt, lat, o in zip(arrival, ttft, latency, outs)])
    per_second = np.bincount((token_times - start).astype(int)) if len(token_times) else np.zeros(1)
    doc: dict[str, Any] = {
        "date": (date or datetime(2026, 1, 1)).strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": backend, "backend": backend, "label": None, "model_id": model_id, "tokenizer_id": model_id,
        "num_prompts": int(len(req)),
    }
    for k, v in (metadata or {}).items():       # vLLM stores --metadata values as strings
        doc[str(k)] = str(v)
    doc["request_rate"] = "inf" if request_rate == "inf" or float(request_rate) == float("inf") else float(request_rate)
    doc["burstiness"] = float(burstiness)
    doc["max_concurrency"] = max_concurrency
    doc.update({
        "duration": duration, "completed": int(len(done)), "failed": int(len(req) - len(done)),
        "total_input_tokens": int(ins.sum()), "total_output_tokens": int(outs.sum()),
        "request_throughput": len(done) / duration, "request_goodput": None,
        "output_throughput": float(outs.sum()) / duration,
        "total_token_throughput": float(ins.sum() + outs.sum()) / duration,
        "input_lens": ins.tolist(), "output_lens": outs.tolist(), "ttfts": ttft.tolist(), "itls": itls,
        "latencies": latency.tolist(), "start_times": (arrival + 1000.0).tolist(),
        "queue_times": [0.0] * len(done), "generated_texts": [""] * len(done), "errors": [""] * len(done),
        "max_output_tokens_per_s": float(per_second.max()), "max_concurrent_requests": int(peak), "rtfx": 0.0,
    })
    doc.update(_stats(ttft, "ttft", percentiles))
    doc.update(_stats(tpot, "tpot", percentiles))
    doc.update(_stats(pooled_itl, "itl", percentiles))
    doc.update(_stats(latency, "e2el", percentiles))
    if not detailed:
        for key in ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors"):
            doc.pop(key, None)
    return doc


def write(result: SimulationResult, path: str | Path, model_id: str, **kwargs: Any) -> dict[str, Any]:
    doc = result_dict(result, model_id, **kwargs)
    Path(path).write_text(json.dumps(doc))
    return doc
