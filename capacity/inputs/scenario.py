"""A scenario: what is deployed, how the engine is configured, what traffic arrives, which SLOs.

Scenarios are YAML files validated by pydantic (unknown or misspelled keys are errors). `load`
resolves a name from the shipped `scenarios/` folder or a path, applies `--set dotted.key=value`
overrides, and turns any validation problem into a one-line CapacityError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from capacity.errors import CapacityError
from capacity.paths import scenarios_dir
from capacity.inputs.traffic import TrafficConfig

DEFAULT_SCENARIO = "default"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Deployment(_Strict):
    gpu: str = "MI300X"
    model: str
    precision: str | None = Field(None, description="weight precision override (bf16, fp8, mxfp8, int4, mxfp4, fp4); default: the checkpoint's own")
    kv_cache_dtype: Literal["bf16", "fp8"] = "bf16"
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    expert_parallel: bool = Field(False, description="vLLM --enable-expert-parallel: MoE experts are spread whole over "
                                                     "the tensor-parallel GPUs instead of sliced (EP size = TP size)")
    replicas: int = Field(1, ge=1)
    router: Literal["round_robin", "least_outstanding"] = "least_outstanding"
    gpu_overrides: dict[str, Any] = Field(default_factory=dict, description="e.g. {efficiency: {gemm: 0.6}, cost_per_gpu_hour_usd: 2.5}")


class Engine(_Strict):
    """vLLM engine arguments. Defaults are vLLM's for the OpenAI server on GPUs with >= 70 GiB
    (vllm/engine/arg_utils.py `get_batch_defaults`: 8192 batched tokens, 1024 sequences)."""

    max_num_batched_tokens: int = Field(8192, ge=1)
    max_num_seqs: int = Field(1024, ge=1)
    block_size: int = Field(16, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    long_prefill_token_threshold: int = Field(0, ge=0)
    enable_chunked_prefill: bool = True
    model_runner: Literal["v1", "v2"] = Field(
        "v1", description="vLLM GPU model runner (VLLM_USE_V2_MODEL_RUNNER=1 selects v2). v1, the default, does "
                          "per-request host work in speculative steps that the hardware profile's "
                          "spec_seq_overhead_us prices; v2 prepares inputs and counts accepted drafts on the GPU "
                          "(targets with linear-attention state still pay it on v2)")
    activation_reserve_gb: float = Field(
        6.0, ge=0,
        description="assumed: per-GPU memory vLLM's profiling run keeps for activations, CUDA/HIP graphs and "
                    "non-torch allocations (not measured here; calibrate or override)")


class Speculative(_Strict):
    method: str = "none"
    num_speculative_tokens: int = Field(0, ge=0)
    draft: str | None = None
    acceptance: dict[str, Any] | None = None
    policy: dict[str, Any] | None = None
    overrides: dict[str, Any] | None = Field(None, description="method cost parameters, e.g. {draft_pass_overhead_us: 80}")


class Simulation(_Strict):
    seed: int = 0
    max_sim_time_s: float | None = Field(None, gt=0, description="stop the clock here; default: last arrival × 1.5 + 300 s")


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    deployment: Deployment
    engine: Engine = Field(default_factory=Engine)
    speculative: Speculative = Field(default_factory=Speculative)
    traffic: TrafficConfig
    slo: str | None = Field(None, description="e.g. 'ttft:p99<1s;tpot:p90<40ms'")
    simulation: Simulation = Field(default_factory=Simulation)
    plan: dict[str, Any] | None = Field(None, description="search space and target of `capacity plan` (capacity/studies/plan.py)")


def resolve_path(name_or_path: str | None) -> Path:
    """A shipped scenario name ('default', 'chatbot') or a path to a YAML file."""
    if name_or_path is None:
        name_or_path = DEFAULT_SCENARIO
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = scenarios_dir() / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    known = sorted(p.stem for p in scenarios_dir().glob("*.yaml"))
    raise CapacityError(f"scenario '{name_or_path}' not found: give a YAML path or one of: {', '.join(known)}")


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `dotted.key=value` overrides; the value is parsed as YAML (numbers, lists, ...)."""
    for item in overrides:
        if "=" not in item:
            raise CapacityError(f"--set '{item}': expected dotted.key=value, e.g. deployment.replicas=4")
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw)
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise CapacityError(f"--set '{item}': '{part}' is not a section")
            node = child
        node[parts[-1]] = value
    return data


def _one_line(error: ValidationError, source: str) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-"))
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key (check its spelling; see scenarios/README.md for the schema)"
    elif first["type"] == "missing":
        msg = "required key is missing"
    more = f" (+{len(error.errors()) - 1} more)" if len(error.errors()) > 1 else ""
    return f"{source}: {where}: {msg}{more}"


def from_dict(data: dict[str, Any], source: str = "scenario") -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise CapacityError(_one_line(e, source)) from None


def read_yaml(name_or_path: str | None) -> tuple[Path, Any]:
    """(path, parsed YAML) of a shipped scenario name or a path; broken YAML is a one-line error."""
    path = resolve_path(name_or_path)
    try:
        return path, yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise CapacityError(f"{path}:{where}: not valid YAML ({getattr(e, 'problem', e)})") from None


def load(name_or_path: str | None = None, overrides: list[str] | None = None) -> Scenario:
    path, data = read_yaml(name_or_path)
    if not isinstance(data, dict):
        raise CapacityError(f"{path}: a scenario is a YAML mapping with deployment and traffic sections")
    data = apply_overrides(data, overrides or [])
    return from_dict(data, str(path))
