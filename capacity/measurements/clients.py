"""How the measured runs were driven: their benchmark clients' length rules and serve flags.

* serving rows: benchmark_clients.yaml says, per `source_id`, from which range of the nominal
  isl/osl the source's client drew its random lengths (`length_fractions`, `random_lengths`) and
  its prompt count where a row does not state one (`client_of`); `v0_engine` tells the vLLM
  releases that ran the V0 engine;
* serving rows: serve_recipes.yaml gives the serve flags of a measured series that its rows do not
  carry (KV-cache dtype, batched-token budget, async scheduling), read from the series' published
  benchmark script (`serve_recipe`);
* the seed article's speedup rows: SEED_WORKLOAD, the request shape its client is assumed to have
  sent, and seed_serve_flags.yaml, the serve command's model runner and kernel choices per target
  (`model_runner`, `attention_backend`, `moe_backend`, `int4_moe_tiles`).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import yaml

from capacity.paths import data_dir

# Assumed request shape of the seed article's benchmark (it reports neither ISL nor OSL):
# * prompts: GSM8K / MATH500 questions (~50-150 tokens) plus the client's "reason step by step"
#   suffix (~20 tokens) and a chat template (~10-30 tokens); HumanEval signatures + docstrings
#   (~100-250 tokens); MBPP sanitized prompts (~20-60 tokens) -> uniform [64, 256] covers them all.
# * outputs: step-by-step math solutions and code answers of a few hundred tokens up to the
#   z-lab/dflash client's default cap of 2048 new tokens (`--max-new-tokens 2048`, dflash/benchmark.py;
#   the article's datasets are exactly that client's) and thinking targets (Kimi-K2.5, MiniMax-M3,
#   Gemma 4 with its reasoning parser) running to the cap -> uniform [512, 2048] (mean 1280).
# One shape for every dataset, so that one load per target is one physical thing.
SEED_WORKLOAD = {"input_tokens": {"dist": "uniform", "low": 64, "high": 256},
                 "output_tokens": {"dist": "uniform", "low": 512, "high": 2048}}


@lru_cache(maxsize=1)
def benchmark_clients() -> dict[str, Any]:
    return yaml.safe_load((data_dir() / "measurements" / "benchmark_clients.yaml").read_text()) or {}


def client_of(row: dict[str, Any]) -> dict[str, Any]:
    """The benchmark_clients.yaml entry of the row's `source_id` (the default entry for other sources)."""
    clients = benchmark_clients()
    return (clients.get("sources") or {}).get(str(row.get("source_id", "")).strip()) or clients.get("default") or {}


def length_fractions(row: dict[str, Any]) -> tuple[float, float]:
    """(low, high): the row's client drew random lengths uniformly from [low, high] x the nominal
    isl/osl (benchmark_clients.yaml, by `source_id`; its default entry for other sources)."""
    entry = client_of(row)
    return float(entry["low"]), float(entry["high"])


def random_lengths(row: dict[str, Any], isl: float, osl: float) -> dict[str, dict[str, Any]]:
    """The input/output length distributions of a row's random-dataset requests (`length_fractions`)."""
    low, high = length_fractions(row)

    def dist(n: float) -> dict[str, Any]:
        hi = max(1, int(round(high * n)))
        return {"dist": "uniform", "low": min(hi, max(1, int(round(low * n)))), "high": hi}

    return {"input_tokens": dist(isl), "output_tokens": dist(osl)}


def v0_engine(row: dict[str, Any]) -> bool:
    """Whether the row's vLLM (`framework_version`, e.g. "v0.6.7" or "vllm/vllm-openai-rocm:v0.18.0")
    predates 0.8, the first release with the V1 engine on by default: it ran the V0 engine, whose
    scheduler (prefills first, chunked prefill optional) the simulator does not mimic."""
    m = re.search(r"v?(\d+)\.(\d+)", str(row.get("framework_version", "")))
    return bool(m) and int(m.group(1)) == 0 and 0 < int(m.group(2)) < 8     # 0.0.x: not a vLLM release


# The first vLLM release with async scheduling on by default (vllm PR #27614, "Async Scheduling Plan"
# vllm issue #27679, closed 2025-12; the Q4-2025 roadmap item). The shipped rows are v0.11.2 or
# v0.15 and later, so the exact boundary between 0.12 and 0.14 decides none of them (assumed: 0.14).
ASYNC_SCHEDULING_SINCE = (0, 14)


def async_scheduling(row: dict[str, Any]) -> bool:
    """Whether the row's vLLM scheduled asynchronously by default (`ASYNC_SCHEDULING_SINCE`); a
    version that cannot be read (an image tag such as deepseekv4-cu130, or 0.0.x, not a vLLM release)
    counts as recent."""
    m = re.search(r"v?(\d+)\.(\d+)", str(row.get("framework_version", "")))
    if not m or (int(m.group(1)), int(m.group(2))) == (0, 0):
        return True
    return (int(m.group(1)), int(m.group(2))) >= ASYNC_SCHEDULING_SINCE


def model_runner(row: dict[str, Any]) -> str:
    """The vLLM model runner a row ran with: its `model_runner` column if it has one, else the seed
    article's serve command for its target (`seed_serve_flags.yaml`), else vLLM's default, v1."""
    value = row.get("model_runner")
    if isinstance(value, str) and value.strip():
        return value.strip().lower()
    return _target_flag(row, "model_runner", "v1")


def attention_backend(row: dict[str, Any]) -> str:
    """The attention backend a seed-article row's target is simulated with (a scenario's
    engine.attention_backend): the target's `attention_backend` in `seed_serve_flags.yaml`, else "auto"."""
    return _target_flag(row, "attention_backend", "auto")


def moe_backend(row: dict[str, Any]) -> str:
    """The fused-MoE kernels a seed-article row's target is simulated with (a scenario's engine.moe_backend): the
    target's `moe_backend` in `seed_serve_flags.yaml`, else "auto"."""
    return _target_flag(row, "moe_backend", "auto")


def int4_moe_tiles(row: dict[str, Any]) -> str:
    """The int4 MoE tiles a seed-article row's target is simulated with (a scenario's engine.int4_moe_tiles): the
    target's `int4_moe_tiles` in `seed_serve_flags.yaml`, else "auto" (vLLM's shipped tile files)."""
    return _target_flag(row, "int4_moe_tiles", "auto")


def _target_flag(row: dict[str, Any], key: str, default: str) -> str:
    """`key` of the row's target in `seed_serve_flags.yaml`, else `default`."""
    return str(_serve_flags().get(str(row.get("target")), {}).get(key, default))


@lru_cache(maxsize=1)
def _serve_flags() -> dict[str, Any]:
    return (yaml.safe_load((data_dir() / "measurements" / "seed_serve_flags.yaml").read_text()) or {}).get("targets", {})


@lru_cache(maxsize=1)
def serve_recipes() -> list[dict[str, Any]]:
    return (yaml.safe_load((data_dir() / "measurements" / "serve_recipes.yaml").read_text()) or {}).get("recipes") or []


def recipe_matches(match: dict[str, Any], row: dict[str, Any]) -> bool:
    """Whether every `match` column of a serve_recipes.yaml entry equals the row's cell (an empty or
    NaN cell reads as ""; numbers compare as numbers, so 16 matches a cell of 16.0); a list matches
    any of its values."""
    def cell(key: str) -> str:
        v = row.get(key)
        return "" if v is None or (isinstance(v, float) and v != v) else str(v).strip()

    def same(have: str, want: Any) -> bool:
        want = str(want).strip()
        try:
            return float(have) == float(want)
        except ValueError:
            return have == want
    return all(any(same(cell(k), w) for w in (v if isinstance(v, list) else [v])) for k, v in match.items())


def serve_recipe(row: dict[str, Any]) -> dict[str, Any]:
    """The scenario keys (dotted) the row's series was served with beyond the defaults: `set` of the
    first serve_recipes.yaml entry that `recipe_matches` the row, then its `inferred` keys (what the
    rows' own behaviour shows where it contradicts the script; {} if no entry matches)."""
    for entry in serve_recipes():
        if recipe_matches(entry.get("match") or {}, row):
            return {**(entry.get("set") or {}), **(entry.get("inferred") or {})}
    return {}
