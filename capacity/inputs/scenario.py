"""A scenario: what is deployed, how the engine is configured, what traffic arrives, which SLOs.

Scenarios are YAML files validated by pydantic (unknown or misspelled keys are errors). `load`
resolves a name from the shipped `scenarios/` folder or a path, applies `--set dotted.key=value`
overrides, and turns any validation problem into a one-line CapacityError. Every key, its default,
unit and meaning: scenarios/README.md, generated from these models by capacity/inputs/scenario_doc.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

import math

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from capacity.errors import CapacityError
from capacity.paths import scenarios_dir
from capacity.inputs.traffic import Arrival, TrafficConfig
from capacity.inputs import safe_yaml
from capacity.util.text import quote

DEFAULT_SCENARIO = "default"
MAX_SPEC_TOKENS = 64      # drafts per step: published configurations use at most 16 (DFlash); beyond 64 is a typo
MAX_NAME_BYTES = 255      # one path component (file systems refuse longer names)
MAX_PATH_BYTES = 4096

# process name -> the keys its arrival model takes (the discriminated union of inputs/traffic.py)
_ARRIVAL_FIELDS: dict[str, frozenset[str]] = {
    model.model_fields["process"].default: frozenset(model.model_fields) for model in get_args(get_args(Arrival)[0])}


def _check_name(value: str | None) -> str | None:
    """A model/GPU/draft name or path the file system can look up (no component over 255 bytes)."""
    if value is None:
        return value
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_PATH_BYTES or any(len(part) > MAX_NAME_BYTES for part in raw.split(b"/")):
        raise ValueError(f"a name of {len(raw)} bytes (at most {MAX_NAME_BYTES} per path component); give a "
                         f"Hugging Face id, a shipped name or a file path")
    if "\x00" in value:
        raise ValueError("a name with a NUL character; give a Hugging Face id, a shipped name or a file path")
    return value


def _check_finite(value: Any, where: str = "") -> Any:
    """Free-form mappings (plan, overrides, acceptance, policy, gpu_overrides) hold no inf or NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where or 'value'} is {value}; give a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, f"{where}[{i}]")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Deployment(_Strict):
    """What is deployed: the GPU, the model and how it is split over GPUs and replicas."""

    gpu: str = Field("MI300X", description="GPU profile: a name from hw_profiles/ (case-insensitive; `capacity hardware` "
                                           "lists them) or the path of a profile YAML (e.g. one `capacity calibrate --out` wrote)")
    model: str = Field(description="target model: a Hugging Face id from capacity/data/model_configs/ (`capacity models` "
                                   "lists them) or the path of a Hugging Face config.json")
    precision: str | None = Field(None, description="weight precision override (bf16, fp8, mxfp8, int4, mxfp4, fp4, nvfp4; nvfp4_w4a4 / mxfp4_w4a4 when the activations are 4-bit too, which runs on FP4 tensor cores; mxfp4_w4a8 with 8-bit activations, on FP8 tensor cores); default: the checkpoint's own")
    kv_cache_dtype: Literal["bf16", "fp8"] = Field("bf16", description="KV-cache data type (vLLM --kv-cache-dtype): 2 or 1 byte per cached value")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs per replica (vLLM --tensor-parallel-size)")
    expert_parallel: bool = Field(False, description="vLLM --enable-expert-parallel: MoE experts are spread whole over "
                                                     "the tensor-parallel GPUs instead of sliced (EP size = TP size)")
    replicas: int = Field(1, ge=1, description="identical engine replicas behind the router; GPUs = replicas × tensor_parallel_size")
    router: Literal["round_robin", "least_outstanding", "session_affinity", "prefix_aware"] = Field(
        "least_outstanding", description="how requests are spread over replicas: in turn; to the replica with the "
                                         "fewest unfinished requests (ties: the lowest index); session_affinity: a "
                                         "conversation's turns stay on the replica its first turn went to (least "
                                         "outstanding); prefix_aware: llm-d's endpoint picker, 3 x the share of the "
                                         "prompt cached on a replica (the share form assumed) + 2 x its waiting-queue score")
    gpu_overrides: dict[str, Any] = Field(default_factory=dict, description="e.g. {efficiency: {gemm: 0.6}, cost_per_gpu_hour_usd: 2.5}")

    _names = field_validator("gpu", "model")(_check_name)
    _finite = field_validator("gpu_overrides")(_check_finite)


class Engine(_Strict):
    """vLLM engine arguments. Defaults are vLLM's for the OpenAI server on GPUs with >= 70 GiB
    (vllm/engine/arg_utils.py `get_batch_defaults`: 8192 batched tokens, 1024 sequences)."""

    max_num_batched_tokens: int = Field(8192, ge=1, description="token budget of one engine step (prefill chunks + "
                                                                 "decode and verification tokens), per replica")
    max_num_seqs: int = Field(1024, ge=1, description="most requests running at once in one replica")
    block_size: int = Field(16, ge=1, description="tokens per KV-cache block", json_schema_extra={"unit": "tokens"})
    max_model_len: int | None = Field(
        None, ge=1, description="vLLM --max-model-len: a request whose prompt + output tokens exceed it is refused "
                                "by the server and counted as failed, outside every statistic, as vllm bench serve "
                                "does; null = the model config's max_position_embeddings",
        json_schema_extra={"unit": "tokens"})
    max_cudagraph_capture_size: int | None = Field(
        None, ge=1, description="vLLM --max-cudagraph-capture-size (or the largest of compilation-config "
                                "cudagraph_capture_sizes): the largest step, in scheduled tokens, replayed from a "
                                "captured graph; a larger step (a long prompt chunk) launches its kernels from the "
                                "host. null = vLLM's default, min(2 x max_num_seqs x (1 + num_speculative_tokens), "
                                "512); at most max_num_batched_tokens either way",
        json_schema_extra={"unit": "tokens"})
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="fraction of each GPU's HBM vLLM may use for "
                                                                        "weights, activations and the KV cache")
    long_prefill_token_threshold: int = Field(0, ge=0, description="most prompt tokens one request gets in a step "
                                                                   "(vLLM --long-prefill-token-threshold); 0 = no cap")
    enable_chunked_prefill: bool = Field(True, description="false: a waiting request is admitted only when its whole "
                                                           "prompt fits the step's remaining token budget")
    enable_prefix_caching: bool = Field(
        True, description="vLLM's automatic prefix caching (on by default, as in vLLM): a request starts at its "
                          "longest cached prefix of full KV blocks; blocks are known only from traffic that carries "
                          "identities (sessions, traces with hash_ids); false = every prompt is computed whole")
    model_runner: Literal["v1", "v2"] = Field(
        "v1", description="vLLM GPU model runner (VLLM_USE_V2_MODEL_RUNNER=1 selects v2). v1, the default, does "
                          "per-request host work in speculative steps that the hardware profile's "
                          "spec_seq_overhead_us prices; v2 prepares inputs and counts accepted drafts on the GPU "
                          "(targets with linear-attention state still pay it on v2)")
    async_scheduling: bool = Field(
        True, description="vLLM --async-scheduling (on by default since vLLM 0.14; off for CPU n-gram drafting, "
                          "which vLLM runs synchronously): the scheduler prepares the next step while the GPU runs "
                          "this one, so a step lasts max(GPU time, host time) instead of their sum")
    quick_reduce_quantization: Literal["none", "fp", "int8", "int6", "int4"] = Field(
        "none", description="vLLM's VLLM_ROCM_QUICK_REDUCE_QUANTIZATION (default NONE: off). On AMD gfx94x/gfx95x "
                            "(MI300X, MI325X, MI350X, MI355X) at TP 2, 4 or 8, all-reduces of at least 1-16 MiB "
                            "(vLLM's _QR_MIN_SIZE table) go through QuickReduce's two-shot with their bytes quantized "
                            "(int4: 0.28 of the 16-bit bytes); ignored on other GPUs, as vLLM ignores it")
    attention_backend: Literal["auto", "flash", "triton", "rocm"] = Field(
        "auto", description="the attention kernel family vLLM runs: 'flash' (FlashAttention / CK / AITER FA / "
                            "FlashInfer kernels, efficiency.attention), 'triton' (vLLM's Triton unified-attention "
                            "kernel, efficiency.attention_triton), 'rocm' (vLLM's ROCM_ATTN, the ROCm default from "
                            "vLLM 0.19 when --attention-backend is not given: prompt chunks and speculative "
                            "verification run a Triton prefix-prefill kernel that pads each sequence's queries to "
                            "128 rows, 32 on hybrid models; efficiency.attention_triton), 'auto': vLLM's choice as "
                            "the simulator knows it (triton for a model with attention sinks on ROCm, flash "
                            "otherwise; GpuProfile.attention_efficiency_key)")
    moe_backend: Literal["auto", "triton", "aiter"] = Field(
        "auto", description="the fused-MoE kernels vLLM runs a MoE model's experts with: 'triton' (vLLM's fused_moe: "
                            "grouped GEMMs with separate activation and top-k sum kernels), 'aiter' (AMD AITER's two-stage "
                            "fused MoE, VLLM_ROCM_USE_AITER=1 on AMD Instinct GPUs: two kernels fewer per MoE layer), "
                            "'auto': vLLM's choice: aiter for Quark MXFP4 (mxfp4_w4a4) experts on a GPU with native "
                            "fp4 (gfx950, vLLM quark_moe.py), triton otherwise. The fixed time per kernel of a profile "
                            "with kernels_per_dense_layer depends on it, and on CDNA3/CDNA4 aiter prices the experts "
                            "from AITER's measured kernel times")
    int4_moe_tiles: Literal["auto", "tuned", "default"] = Field(
        "auto", description="the tiles of vLLM's Triton MoE kernel for weight-only int4 (W4A16) experts on AMD GPUs "
                            "(e.g. Kimi-K2.5 INT4): 'auto': the tuned tile file vLLM ships for the GPU and MoE shape "
                            "where there is one (capacity/data/vllm_int4_moe_configs.yaml), else its default tiles, "
                            "which stream the experts 6x slower; 'tuned': your server reads tuned tiles for this shape "
                            "(e.g. from vLLM's benchmarks/kernels/benchmark_moe.py --tune, via VLLM_TUNED_CONFIG_FOLDER); "
                            "'default': no tuned file. Other GPUs and expert formats ignore it")
    activation_reserve_gb: float | None = Field(
        None, ge=0,
        description="per-GPU memory besides the weights that vLLM's start-up profiling takes from the KV cache "
                    "(its profiling run's torch peak and non-torch memory); default: derived from the model, "
                    "max_num_batched_tokens, max_num_seqs and TP size as vLLM's profiling finds it "
                    "(capacity/sim/memory.py); set a number (e.g. from your server's 'torch peak memory increase' "
                    "and 'non-torch forward increase memory' log lines) to override")


class Speculative(_Strict):
    """Speculative decoding: the drafting method, drafts per step, acceptance and policy (spec/decoding.py)."""

    method: str = Field("none", max_length=100, description="drafting method of capacity/data/methods.yaml (`capacity methods`), or "
                                            "none; other spellings such as EAGLE-3 are accepted")
    num_speculative_tokens: int = Field(0, ge=0, le=MAX_SPEC_TOKENS,
                                        description="drafted tokens N per verification step (vLLM's "
                                                    "num_speculative_tokens); 0 = speculation off")
    draft: str | None = Field(None, description="draft checkpoint id or config.json path; default: the method's "
                                                "default draft for the target (methods.yaml); mtp and ngram take none")
    acceptance: dict[str, Any] | None = Field(None, description="how many drafts are accepted; default: the seed "
                                                                "article's profile of the method and target for chat")
    policy: dict[str, Any] | None = Field(None, description="how many tokens to draft each step; default: always N")
    overrides: dict[str, Any] | None = Field(None, description="method cost parameters, e.g. {draft_pass_overhead_us: 80}")

    _names = field_validator("draft")(_check_name)
    _finite = field_validator("acceptance", "policy", "overrides")(_check_finite)

    @field_validator("policy")
    @classmethod
    def _policy_bounds(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        max_n = (value or {}).get("max_n")
        if isinstance(max_n, int) and not isinstance(max_n, bool) and max_n > MAX_SPEC_TOKENS:
            raise ValueError(f"max_n is {max_n}; use at most {MAX_SPEC_TOKENS} drafted tokens")
        return value


class Simulation(_Strict):
    """How the simulation itself runs."""

    seed: int = Field(0, ge=0, le=2**63 - 1, description="seed of every random draw (arrivals, lengths, class mix, acceptance): "
                                     "the same seed gives the same result")
    max_sim_time_s: float | None = Field(None, gt=0, description="stop the clock here; default: last arrival × 1.5 + 300 s")


class Scenario(_Strict):
    """A whole scenario file."""

    name: str = Field("scenario", max_length=MAX_NAME_BYTES, description="a short name, used in reports and output folders")
    description: str = Field("", max_length=10_000, description="one line saying what the scenario is")
    deployment: Deployment = Field(description="what is deployed")
    engine: Engine = Field(default_factory=Engine, description="vLLM engine arguments")
    speculative: Speculative = Field(default_factory=Speculative, description="speculative decoding; off by default")
    traffic: TrafficConfig = Field(description="what arrives and when to stop")
    slo: str | None = Field(None, max_length=1000, description="service-level objectives, e.g. 'ttft:p99<1s;tpot:p90<40ms'; "
                                             "an item naming a traffic class, e.g. 'ttft[support]:p99<1s', is judged on "
                                             "that class's requests only; none: no SLO check (`capacity plan` needs them)")
    simulation: Simulation = Field(default_factory=Simulation, description="seed and horizon")
    plan: dict[str, Any] | None = Field(None, description="search space and target of `capacity plan` (capacity/studies/plan.py)")

    _finite = field_validator("plan")(_check_finite)


def resolve_path(name_or_path: str | None) -> Path:
    """A shipped scenario name (a file stem of scenarios/, e.g. 'default') or a path to a YAML file."""
    if name_or_path is None:
        name_or_path = DEFAULT_SCENARIO
    path = Path(name_or_path)
    try:
        if path.is_file():
            return path
        shipped = scenarios_dir() / f"{name_or_path}.yaml"
        if shipped.is_file():
            return shipped
    except (OSError, ValueError):     # a name too long for the file system, or with a NUL byte
        pass
    known = sorted(p.stem for p in scenarios_dir().glob("*.yaml"))
    raise CapacityError(f"scenario '{quote(name_or_path)}' not found: give a YAML path or one of: {', '.join(known)}")


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `dotted.key=value` overrides; the value is parsed as YAML (numbers, lists, ...)."""
    for item in overrides:
        if "=" not in item:
            raise CapacityError(f"--set '{quote(item)}': expected dotted.key=value, e.g. deployment.replicas=4")
        key, raw = item.split("=", 1)
        value = safe_yaml.loads(raw, f"--set {quote(key, 60)}")
        node = data
        parts = key.strip().split(".")
        if not all(parts):
            raise CapacityError(f"--set '{quote(key)}': empty part in the dotted key; write e.g. "
                                f"deployment.replicas=4")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise CapacityError(f"--set '{quote(item)}': '{quote(part, 60)}' is not a section")
            node = child
        if parts[-2:] == ["arrival", "process"] and node.get("process") != value:
            _switch_process(node, value)
        node[parts[-1]] = value
    return data


def _switch_process(arrival: dict[str, Any], process: Any) -> None:
    """`--set traffic.arrival.process=trace` on a Poisson scenario: drop the keys the new process does
    not take (its rate_rps), keep those it shares (gamma keeps a Poisson rate_rps), so a one-line
    what-if needs no hand edit; later `--set` items give the new process its own keys."""
    allowed = _ARRIVAL_FIELDS.get(str(process))
    if allowed is not None:
        for key in [k for k in arrival if k not in allowed]:
            del arrival[key]


def one_line(error: ValidationError, source: str) -> str:
    """A pydantic ValidationError as one line: the source, the dotted key of the first problem, what is wrong."""
    first = error.errors()[0]
    where = quote(".".join(str(p) for p in first["loc"] if not str(p).startswith("function-")), 100) or "(top level)"
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        msg = "unknown key (check its spelling; see scenarios/README.md for the schema)"
    elif first["type"] == "missing":
        msg = "required key is missing"
    more = f" (+{len(error.errors()) - 1} more)" if len(error.errors()) > 1 else ""
    return f"{source}: {where}: {quote(msg, 200)}{more}"


def from_dict(data: dict[str, Any], source: str = "scenario") -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as e:
        raise CapacityError(one_line(e, source)) from None


def read_yaml(name_or_path: str | None) -> tuple[Path, Any]:
    """(path, parsed YAML) of a shipped scenario name or a path; broken YAML is a one-line error."""
    path = resolve_path(name_or_path)
    return path, safe_yaml.load_file(path)


def load(name_or_path: str | None = None, overrides: list[str] | None = None) -> Scenario:
    path, data = read_yaml(name_or_path)
    if not isinstance(data, dict):
        raise CapacityError(f"{path}: a scenario is a YAML mapping with deployment and traffic sections")
    data = apply_overrides(data, overrides or [])
    return from_dict(data, str(path))
