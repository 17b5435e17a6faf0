"""Drafting methods as data, the price of the drafter's work per engine step, and the object the
engine talks to (`SpeculativeDecoding`, the `capacity.spec.interface.Speculation` protocol).

* `capacity/data/methods.yaml` describes each method (mtp, gemma4_mtp, eagle3, dflash, dspark,
  draft_model, ngram): what the drafter is, how vLLM v1 runs it (with the vLLM source lines), how
  many KV slots it reserves ahead, which N it allows, the default draft checkpoint per target (seed
  article) and its `assumed` overhead parameters. `get_method` / `list_methods` / `methods_table`.
* `DraftCost` prices one step's drafting with the SAME roofline as the target: `StepCostModel`
  (same GPU, same TP) on architectures built from the drafter, split into the pieces vLLM runs:

  - ``sequential`` (mtp, gemma4_mtp, eagle3, draft_model; vLLM llm_base_proposer): a first draft
    forward over every token of the target forward (T; + one slot per request for draft models),
    logits at one row per request, then N − 1 forwards over the B requests; N LM-head calls of B
    rows; the drafter's attention over each request's context in every pass; N × pass overhead.
    EAGLE-3's fc over the target features runs in the first pass only.
  - ``parallel_block`` (dflash, dspark): a context-K/V projection of the T target tokens (fc over
    the target features + one fused K/V GEMM for all layers), ONE forward of the drafter layers over
    B·(N + 1) (DFlash) or B·N (DSpark) query positions attending c_i + block keys, the LM head on
    B·N rows, and for DSpark N sequential Markov-head steps (rank-r GEMV over the draft vocabulary for
    B rows each); 1 × pass overhead (+ N × Markov-step overhead).
  - ``cpu`` (ngram): B × cpu_us_per_seq.

  B = all requests scheduled in the step (vLLM drafts over the whole padded batch, partial prefills
  included), T = tokens in the target forward, C = Σ context of the B requests. With only the sums
  known (`time_s`), each request is taken to hold T/B new tokens at context C/B: exact for
  full-attention layers in decode steps, an approximation for sliding-window layers and for mixed
  prefill steps. `SpeculativeDecoding.draft_time` has the per-request arrays and prices attention
  exactly. Not modelled: CPU-side proposer bookkeeping beyond the per-pass overhead, the
  all-gather of vocab-parallel logits, EAGLE/DFlash fc replication under TP (taken as split).

The drafter's structure comes from `capacity.inputs.models`: draft checkpoints via `load_model`, the
native MTP module built from the target (one decoder layer — a MoE layer for MoE targets — with the
target's per-layer attention, fc 2H→H, the target's LM head; `ModelArch.params_native_mtp`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import yaml

from capacity.errors import CapacityError
from capacity.inputs.models import ModelArch, load_model
from capacity.paths import data_dir
from capacity.spec.policies import SpeculationPolicy, policy_from_config
from capacity.spec.interface import NoSpeculation
from capacity.cost.step_cost import AttentionTables, StepCostModel, StepFeatures, StepTime, fast_maximum, int_sum

if TYPE_CHECKING:
    from capacity.inputs.hardware import GpuProfile
    from capacity.spec.interface import Speculation

PART_KEYS = ("passes", "lm_head", "attention", "markov", "cpu", "overhead")
"""Keys of `DraftCost.parts`; they sum to `DraftCost.time_s`."""

_KINDS = ("sequential", "parallel_block", "cpu")
_MAX_N_RULES = ("none", "mtp_modules", "block_size_minus_1")
_DRAFTERS = ("target_mtp", "checkpoint", "none")
_REQUIRES = (None, "native_mtp", "target_model_type_gemma4", "same_vocab")
_NO_SPECULATION = ("none", "off", "")


# --------------------------------------------------------------------------------------------------
# Methods (data)
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MethodParameter:
    """One overridable number of a method, with its provenance."""

    value: float
    unit: str
    basis: str
    source: str


@dataclass(frozen=True)
class DraftMethod:
    """One drafting method as described in capacity/data/methods.yaml."""

    name: str
    label: str
    description: str
    vllm_method: str
    vllm_proposer: str
    drafter: str                      # target_mtp | checkpoint | none
    drafter_text: str
    requires: str | None              # native_mtp | target_model_type_gemma4 | same_vocab | None
    kind: str                         # sequential | parallel_block | cpu
    cost: Mapping[str, Any] = field(hash=False)
    passes_per_step: str = ""
    cost_text: str = ""
    reserves_lookahead: bool = False
    lookahead_source: str = ""
    max_n_rule: str = "none"
    max_n_text: str = ""
    max_n_source: str = ""
    weights_text: str = ""
    kv_text: str = ""
    default_drafts: Mapping[str, str] = field(default_factory=dict, hash=False)
    default_drafts_source: str = ""
    parameters: Mapping[str, MethodParameter] = field(default_factory=dict, hash=False)

    def default_draft(self, target: str) -> str | None:
        """The seed article's draft checkpoint for `target` ('built-in' for native MTP), or None."""
        key = target.strip().lower()
        for t, d in self.default_drafts.items():
            if t.lower() == key or t.split("/")[-1].lower() == key:
                return d
        return None

    def flag(self, key: str, default: bool = False) -> bool:
        return bool(self.cost.get(key, default))


def _methods_file() -> str:
    return str(data_dir() / "methods.yaml")


def _text(entry: Mapping[str, Any], key: str, where: str, required: bool = True) -> str:
    value = entry.get(key)
    if value is None:
        if required:
            raise CapacityError(f"{where}: '{key}' is missing; add it (see the other methods in the file)")
        return ""
    return " ".join(str(value).split())


@lru_cache(maxsize=None)
def _load_methods(path: str) -> tuple[DraftMethod, ...]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError as exc:
        raise CapacityError(f"cannot read {path}: {exc.strerror}; reinstall capacity") from None
    except yaml.YAMLError as exc:
        raise CapacityError(f"{path} is not valid YAML ({getattr(exc, 'problem', exc)}); fix the file") from None
    if not isinstance(data, dict) or not isinstance(data.get("methods"), dict):
        raise CapacityError(f"{path} must hold a 'methods' mapping; fix the file")
    out = []
    for name, e in data["methods"].items():
        where = f"{path}: methods.{name}"
        if not isinstance(e, dict):
            raise CapacityError(f"{where} must be a mapping; fix the file")
        cost = dict(e.get("cost") or {})
        kind = cost.get("kind")
        if kind not in _KINDS:
            raise CapacityError(f"{where}.cost.kind is '{kind}'; use one of {', '.join(_KINDS)}")
        drafter = e.get("drafter")
        if drafter not in _DRAFTERS:
            raise CapacityError(f"{where}.drafter is '{drafter}'; use one of {', '.join(_DRAFTERS)}")
        if e.get("requires") not in _REQUIRES:
            raise CapacityError(f"{where}.requires is '{e.get('requires')}'; use one of "
                                f"{', '.join(str(r) for r in _REQUIRES)}")
        max_n = dict(e.get("max_n") or {})
        if max_n.get("rule", "none") not in _MAX_N_RULES:
            raise CapacityError(f"{where}.max_n.rule is '{max_n.get('rule')}'; use one of {', '.join(_MAX_N_RULES)}")
        params: dict[str, MethodParameter] = {}
        for pname, p in (e.get("parameters") or {}).items():
            if not isinstance(p, dict) or not isinstance(p.get("value"), (int, float)) or not p.get("basis") \
                    or not p.get("source"):
                raise CapacityError(f"{where}.parameters.{pname} needs a numeric value, a basis and a source; fix the file")
            params[pname] = MethodParameter(float(p["value"]), str(p.get("unit", "")), str(p["basis"]),
                                            " ".join(str(p["source"]).split()))
        out.append(DraftMethod(
            name=str(name), label=_text(e, "label", where), description=_text(e, "description", where),
            vllm_method=_text(e, "vllm_method", where), vllm_proposer=_text(e, "vllm_proposer", where),
            drafter=drafter, drafter_text=_text(e, "drafter_text", where), requires=e.get("requires"),
            kind=kind, cost=cost, passes_per_step=_text(e, "passes_per_step", where),
            cost_text=_text(e, "cost_text", where), reserves_lookahead=bool(e.get("lookahead", False)),
            lookahead_source=_text(e, "lookahead_source", where),
            max_n_rule=str(max_n.get("rule", "none")), max_n_text=_text(max_n, "text", where, False),
            max_n_source=_text(max_n, "source", where, False),
            weights_text=_text(e, "weights_text", where, False), kv_text=_text(e, "kv_text", where, False),
            default_drafts={str(k): str(v) for k, v in (e.get("default_drafts") or {}).items()},
            default_drafts_source=_text(e, "default_drafts_source", where, False),
            parameters=params))
    return tuple(out)


def list_methods() -> list[DraftMethod]:
    """Every drafting method in capacity/data/methods.yaml, in file order."""
    return list(_load_methods(_methods_file()))


def get_method(name: str) -> DraftMethod:
    """A method by name (case-insensitive; '-' and '_' alike)."""
    key = str(name).strip().lower().replace("-", "_")
    for m in list_methods():
        if m.name == key:
            return m
    known = ", ".join(m.name for m in list_methods())
    raise CapacityError(f"unknown speculative method '{name}'; use one of: {known} (or 'none')")


def methods_table() -> list[dict[str, Any]]:
    """One row per method for `capacity methods [--json]`."""
    rows = []
    for m in list_methods():
        rows.append({
            "name": m.name,
            "label": m.label,
            "description": m.description,
            "vllm_method": m.vllm_method,
            "vllm_proposer": m.vllm_proposer,
            "drafter": m.drafter_text,
            "cost_structure": m.cost_text,
            "passes_per_step": m.passes_per_step,
            "lookahead": ("num_speculative_tokens extra KV slots per running request" if m.reserves_lookahead
                          else "none"),
            "lookahead_source": m.lookahead_source,
            "max_num_speculative_tokens": m.max_n_text,
            "max_n_source": m.max_n_source,
            "draft_weights": m.weights_text,
            "draft_kv_cache": m.kv_text,
            "default_drafts": dict(m.default_drafts),
            "default_drafts_source": m.default_drafts_source,
            "parameters": {k: dataclasses.asdict(p) for k, p in m.parameters.items()},
        })
    return rows


# --------------------------------------------------------------------------------------------------
# Validation of a (method, target, draft, N) combination
# --------------------------------------------------------------------------------------------------

def max_num_speculative_tokens(method: DraftMethod, target: ModelArch, draft: ModelArch | None) -> int | None:
    """The largest N the method accepts for this pair (None = no limit; MTP with k > 1 modules also
    allows multiples of k, see `check_num_speculative_tokens`)."""
    if method.max_n_rule == "block_size_minus_1" and draft is not None and draft.draft is not None \
            and draft.draft.block_size:
        return int(draft.draft.block_size) - 1
    return None


def check_num_speculative_tokens(method: DraftMethod, target: ModelArch, draft: ModelArch | None, n: int) -> None:
    """Raise CapacityError if vLLM (or the checkpoint's block) does not allow N."""
    if n < 0:
        raise CapacityError(f"num_speculative_tokens is {n}; use 0 (off) or a positive number")
    if method.max_n_rule == "block_size_minus_1":
        limit = max_num_speculative_tokens(method, target, draft)
        if limit is not None and n > limit:
            raise CapacityError(
                f"{method.name} with {draft.name if draft else 'this drafter'} (block size {limit + 1}) drafts at most "
                f"{limit} tokens per step; set speculative.num_speculative_tokens <= {limit}")
    elif method.max_n_rule == "mtp_modules":
        k = max(int(target.native_mtp_layers), 1)
        if n > k and n % k:
            raise CapacityError(
                f"{target.name} has {k} MTP modules: num_speculative_tokens must be <= {k} or a multiple of {k} "
                f"(vLLM reuses the modules); got {n}")


def _same(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.strip().lower() == b.strip().lower()


def check_pairing(method: DraftMethod, target: ModelArch, draft: ModelArch | None) -> None:
    """Raise CapacityError when the drafter does not fit the method or the target."""
    if method.requires == "native_mtp" and not target.native_mtp_layers:
        hint = ("use method gemma4_mtp (the Gemma 4 assistant drafter)" if target.model_type.startswith("gemma4")
                else "use eagle3, dflash or ngram, or a target that ships MTP layers (e.g. Qwen/Qwen3.5-27B)")
        raise CapacityError(f"{target.name} has no native MTP module; {hint}")
    if method.requires == "target_model_type_gemma4" and not target.model_type.startswith("gemma4"):
        raise CapacityError(f"gemma4_mtp drafts only for Gemma 4 targets, not {target.name} "
                            f"({target.model_type}); use mtp, eagle3 or dflash")
    if method.drafter != "checkpoint":
        return
    if draft is None:
        raise CapacityError(f"method {method.name} needs a draft checkpoint for {target.name}; set speculative.draft "
                            f"to a shipped draft id or a config.json path (see `capacity methods`)")
    if method.name != "draft_model":
        info = draft.draft
        if info is None or info.method != method.name:
            kind = info.method if info is not None else "plain language model"
            fix = (f"set speculative.method: {info.method}" if info is not None
                   else "use method draft_model, or a draft trained for this method")
            raise CapacityError(f"{draft.name} is a {kind} drafter, not {method.name}; {fix}")
        if info.target and not _same(info.target, target.name):
            default = method.default_draft(target.name)
            fix = f"use {default}" if default else "use a draft trained for it"
            raise CapacityError(f"{draft.name} was trained for {info.target}, not {target.name}; {fix}")
    if method.requires == "same_vocab" and draft.vocab_size != target.vocab_size:
        raise CapacityError(f"draft {draft.name} has a vocabulary of {draft.vocab_size:,} tokens but {target.name} "
                            f"has {target.vocab_size:,}; vLLM's draft_model needs the same tokenizer, pick such a draft")


# --------------------------------------------------------------------------------------------------
# Architectures of the drafter's pieces
# --------------------------------------------------------------------------------------------------

def _linear_only(base: ModelArch, name: str, params: float, bytes_per_param: float, *,
                 per_sampled_row: bool, dtype: str = "bf16") -> ModelArch:
    """A weight matrix priced on its own: `params` weights read once per pass, 2·params FLOPs per
    token (per_sampled_row=False) or per sampled row (an LM head / Markov head)."""
    params = float(params)
    return dataclasses.replace(
        base, name=name, num_layers=0, params_lm_head=int(round(params)) if per_sampled_row else 0,
        dense_flops_per_token=2.0 * params, dense_weight_bytes=params * bytes_per_param,
        num_moe_layers=0, num_experts=0, experts_per_token=0, expert_flops_per_token=0.0, expert_weight_bytes=0.0,
        dense_weight_dtype=dtype, compute_weight_dtype=dtype, uses_mla=False)


def _without(arch: ModelArch, name: str, *, drop_lm_head: bool = True, drop_linear: float = 0.0) -> ModelArch:
    """`arch` without its LM head and without `drop_linear` dense linear weights (fc, Markov head)."""
    lm = arch.params_lm_head if drop_lm_head else 0
    return dataclasses.replace(
        arch, name=name, params_lm_head=arch.params_lm_head - lm,
        dense_flops_per_token=arch.dense_flops_per_token - 2.0 * lm - 2.0 * drop_linear,
        dense_weight_bytes=(arch.dense_weight_bytes - lm * arch.bytes_per_param["embedding"]
                            - drop_linear * arch.bytes_per_param["dense"]))


def _taps(draft: ModelArch, default: int) -> int:
    ids = draft.draft.target_layer_ids if draft.draft is not None else None
    return len(ids) if ids else default


def build_mtp_module(target: ModelArch) -> ModelArch:
    """One native MTP module as a one-layer ModelArch (LM head = the target's).

    Parameters: ModelArch.params_native_mtp / modules (attention + fc 2H→H + norms + MLP or the full
    MoE block); FLOPs 2 × (module − routed experts + LM head) per token, routed experts as in one
    target MoE layer. Attention: one target full-attention layer — GQA 4·nq·head_dim per context
    token (inputs/models.py convention), MLA and all-sparse (DSA) targets the average of their full-KV
    layers; KV per token = ModelArch.mtp_kv_bytes_per_token / modules.
    """
    n = int(target.native_mtp_layers)
    if n <= 0:
        raise CapacityError(f"{target.name} has no native MTP module; use eagle3, dflash or ngram")
    module = target.params_native_mtp / n
    routed = target.num_experts * target.params_per_expert if target.num_moe_layers else 0
    dense = module - routed
    lm = target.params_lm_head
    bpp = target.bytes_per_param
    n_kv_layers = max(int(target.num_full_attention_layers), 1)
    kv = target.mtp_kv_bytes_per_token / n
    all_sparse = target.num_sparse_attention_layers and target.num_sparse_attention_layers == target.num_full_attention_layers
    if all_sparse:
        index_kv = target.index_kv_bytes_per_token / n_kv_layers
        attn = dict(attn_flops_per_token_per_ctx=target.attn_flops_per_token_per_ctx / n_kv_layers,
                    num_sparse_attention_layers=1, sparse_kv_bytes_per_token=max(kv - index_kv, 0.0),
                    index_kv_bytes_per_token=index_kv,
                    sparse_attn_flops_per_token_per_ctx=target.sparse_attn_flops_per_token_per_ctx / n_kv_layers)
    else:
        per_ctx = (target.attn_flops_per_token_per_ctx / n_kv_layers if target.uses_mla
                   else 4.0 * target.num_attention_heads * (target.full_head_dim or target.head_dim))
        attn = dict(attn_flops_per_token_per_ctx=per_ctx, num_sparse_attention_layers=0,
                    sparse_kv_bytes_per_token=0.0, index_kv_bytes_per_token=0.0,
                    sparse_attn_flops_per_token_per_ctx=0.0, sparse_attention_tokens=None)
    moe = bool(target.num_moe_layers)
    return dataclasses.replace(
        target, name=f"{target.name} [MTP module]", role="draft", num_layers=1,
        num_full_attention_layers=1, num_sliding_attention_layers=0, sliding_window=None,
        num_linear_attention_layers=0, kv_bytes_per_token=kv, swa_kv_bytes_per_token=0.0, state_bytes_per_seq=0.0,
        swa_attn_flops_per_token_per_ctx=0.0, linear_attn_flops_per_token=0.0,
        params_total=int(module), params_active=int(dense + lm + (target.experts_per_token * target.params_per_expert if moe else 0)),
        params_embedding=0, params_lm_head=lm,
        num_moe_layers=1 if moe else 0,
        expert_flops_per_token=target.expert_flops_per_token / target.num_moe_layers if moe else 0.0,
        dense_flops_per_token=2.0 * (dense + lm),
        dense_weight_bytes=dense * bpp["dense"] + lm * bpp["embedding"],
        weight_bytes_total=n * (dense * bpp["dense"] + (target.num_experts * target.expert_weight_bytes if moe else 0.0)),
        native_mtp_layers=0, params_native_mtp=0, mtp_kv_bytes_per_token=0.0, draft=None,
        **attn)


def _reading_target_kv(assistant: ModelArch, target: ModelArch) -> ModelArch:
    """The Gemma 4 assistant as it reads the target's KV: each of its full (sliding) layers reads one
    target full (sliding) layer's cache per context token (sliding ones up to the target window)."""
    full = target.kv_bytes_per_token / target.num_full_attention_layers if target.num_full_attention_layers else 0.0
    swa = (target.swa_kv_bytes_per_token / target.num_sliding_attention_layers
           if target.num_sliding_attention_layers else 0.0)
    return dataclasses.replace(
        assistant, kv_bytes_per_token=assistant.num_full_attention_layers * full,
        swa_kv_bytes_per_token=assistant.num_sliding_attention_layers * swa,
        sliding_window=target.sliding_window or assistant.sliding_window, state_bytes_per_seq=0.0,
        sparse_kv_bytes_per_token=0.0, index_kv_bytes_per_token=0.0)


@dataclass(frozen=True)
class _Piece:
    """One priced part of the drafter: an architecture and its StepCostModel."""

    arch: ModelArch
    cost: StepCostModel


# --------------------------------------------------------------------------------------------------
# DraftCost
# --------------------------------------------------------------------------------------------------

ArrayLike = float | int | np.ndarray


class DraftCost:
    """Prices the drafter's work in one engine step with the same roofline as the target
    (StepCostModel on the draft architecture, same GPU and TP). See the module docstring for the
    per-method cost structure."""

    # memo of `steps_time_s` (sizes measured on the built-in scenario and heavier loads: a block's call
    # costs about 0.4 ms plus 0.1 us per context sum, a run's own call about 0.4 ms)
    _MEMO_BLOCK_PER_SEQ = 512   # context sums per block, per sequence ...
    _MEMO_MAX_BLOCK = 4096      # ... up to this many
    _MEMO_MAX_SEQS = 32         # larger batches are priced directly

    def __init__(self, method: DraftMethod | str, gpu: GpuProfile, target: ModelArch, draft: ModelArch | None,
                 tensor_parallel_size: int, num_speculative_tokens: int, overrides: dict[str, Any] | None = None):
        self.method = get_method(method) if isinstance(method, str) else method
        self.gpu = gpu
        self.target = target
        self.tp = int(tensor_parallel_size)
        self.num_speculative_tokens = int(num_speculative_tokens)
        m = self.method
        if m.drafter != "checkpoint":
            draft = None
        check_pairing(m, target, draft)
        check_num_speculative_tokens(m, target, draft, self.num_speculative_tokens)
        self.draft = draft
        self.params = self._parameters(overrides)
        self._overhead_s = self.params.get("draft_pass_overhead_us", 0.0) * 1e-6
        extra = float(m.cost.get("extra_first_pass_tokens_per_seq", 0))
        self._extra_first_pass_tokens = int(extra) if extra.is_integer() else extra
        self._queries_per_seq_offset = float(m.cost.get("queries_per_seq_offset", 0))
        # (shared by simulate.deploy between DraftCosts with equal inputs: keys and values must depend
        # on the inputs only)
        self._steps_memo: dict[tuple[int, float, int], dict[int, np.ndarray]] = {}
        self._linear_memo: dict[tuple[str, float, float, float], float] = {}   # keyed by piece name

        self.extra_swa_kv_bytes_per_token = 0.0
        self.extra_sliding_window: int | None = None
        self.extra_state_bytes_per_seq = 0.0
        self.weight_bytes = 0.0
        self.extra_kv_bytes_per_token = 0.0
        self._first = self._later = self._head = self._context = self._markov = None
        if m.kind == "cpu":
            return
        if m.drafter == "target_mtp":
            arch = build_mtp_module(target)
            self.weight_bytes = arch.weight_bytes_total
            self.extra_kv_bytes_per_token = float(target.mtp_kv_bytes_per_token)
        else:
            assert draft is not None
            arch = draft
            self.weight_bytes = float(draft.weight_bytes_total)
            if m.name == "eagle3" and self.params.get("shares_target_embedding", 0.0):
                self.weight_bytes -= draft.params_embedding * draft.bytes_per_param["embedding"]
            if not (draft.draft is not None and draft.draft.shares_target_kv):
                self.extra_kv_bytes_per_token = float(draft.kv_bytes_per_token)
                self.extra_swa_kv_bytes_per_token = float(draft.swa_kv_bytes_per_token)
                self.extra_sliding_window = draft.sliding_window
                self.extra_state_bytes_per_seq = float(draft.state_bytes_per_seq)
        self.drafter_arch = arch
        bpp = arch.bytes_per_param
        self._head = self._piece(_linear_only(arch, f"{arch.name} [LM head]", arch.params_lm_head,
                                              bpp["embedding"], per_sampled_row=True))
        if m.kind == "sequential":
            reading = _reading_target_kv(arch, target) if m.flag("reads_target_kv") else arch
            self._first = self._piece(_without(reading, f"{arch.name} [first pass]"))
            fc = 0.0
            if m.flag("fc_first_pass_only"):
                fc = _taps(arch, 3) * float(arch.hidden_size) ** 2      # fc taps·H -> H (inputs/models.py, EAGLE-3)
            self._later = self._piece(_without(reading, f"{arch.name} [pass]", drop_linear=fc))
        else:  # parallel_block
            h = float(arch.hidden_size)
            fc = _taps(arch, arch.num_layers) * h * h                   # fc taps·H -> H (inputs/models.py, DFlash/DSpark)
            n_full, n_swa = arch.num_full_attention_layers, arch.num_sliding_attention_layers
            kv_proj = h * 2.0 * (n_full * (arch.full_num_kv_heads or arch.num_kv_heads) * (arch.full_head_dim or arch.head_dim)
                                 + n_swa * arch.num_kv_heads * arch.head_dim)
            self._context = self._piece(_linear_only(arch, f"{arch.name} [context K/V]", fc + kv_proj, bpp["dense"],
                                                     per_sampled_row=False, dtype=arch.dense_weight_dtype))
            markov = 0.0
            if m.flag("markov_steps"):
                info = arch.draft
                rank = (info.markov_rank if info is not None and info.markov_rank else 0)
                vocab = (info.draft_vocab_size if info is not None and info.draft_vocab_size else arch.vocab_size)
                markov = float(rank) * float(vocab)                     # markov_w2 [V, r] (inputs/models.py)
                self._markov = self._piece(_linear_only(arch, f"{arch.name} [Markov head]", markov, bpp["dense"],
                                                        per_sampled_row=True, dtype=arch.dense_weight_dtype))
            self._later = self._piece(_without(arch, f"{arch.name} [block pass]", drop_linear=fc + markov))

    # ------------------------------------------------------------------ setup helpers
    def _parameters(self, overrides: Mapping[str, Any] | None) -> dict[str, float]:
        values = {k: p.value for k, p in self.method.parameters.items()}
        for key, value in (overrides or {}).items():
            if key not in values:
                known = ", ".join(values) or "none"
                raise CapacityError(f"unknown parameter '{key}' for method {self.method.name}; known: {known}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise CapacityError(f"parameter {key} of method {self.method.name} must be a number >= 0, got {value!r}")
            values[key] = float(value)
        return values

    def _piece(self, arch: ModelArch) -> _Piece:
        return _Piece(arch, StepCostModel(self.gpu, arch, self.tp))

    def extra_kv_cache_bytes(self, context_tokens: ArrayLike) -> np.ndarray:
        """Drafter cache bytes per sequence at each context length (sliding layers capped at their window)."""
        c = np.asarray(context_tokens, dtype=float)
        swa = c if self.extra_sliding_window is None else np.minimum(c, float(self.extra_sliding_window))
        return self.extra_kv_bytes_per_token * c + self.extra_swa_kv_bytes_per_token * swa + self.extra_state_bytes_per_seq

    # ------------------------------------------------------------------ pricing
    def _gemm(self, piece: _Piece, tokens: ArrayLike, seqs: ArrayLike, sampled: ArrayLike,
              attn_flops: ArrayLike = 0.0, kv_bytes: ArrayLike = 0.0) -> tuple[ArrayLike, ArrayLike]:
        """(linear layers + all-reduce, attention) seconds of one pass; nothing when it has no tokens."""
        on = tokens > 0
        return self._linear(piece, tokens, seqs, sampled) * on, piece.cost.attention_time(attn_flops, kv_bytes) * on

    def _linear(self, piece: _Piece, tokens: ArrayLike, seqs: ArrayLike, sampled: ArrayLike) -> ArrayLike:
        """Seconds of a pass's linear layers and all-reduces (every part but attention), memoised for
        scalar shapes: the drafter sees the same few (tokens, sequences) again and again. Keyed by
        the piece's name (distinct within a DraftCost), so the memo depends on the inputs only."""
        key = (piece.arch.name, tokens, seqs, sampled) if type(tokens) is float and type(seqs) is float \
            and type(sampled) is float else None
        linear = self._linear_memo.get(key) if key else None
        if linear is None:
            f = StepFeatures(num_tokens=tokens, num_seqs=seqs, num_sampled=sampled, attn_flops=0.0, kv_read_bytes=0.0)
            linear = sum(v for k, v in piece.cost.time_parts(f, with_overhead=False).items() if k != "attention")
            if key:
                self._linear_memo[key] = linear
        return linear

    @staticmethod
    def _attention(piece: _Piece, seqs: ArrayLike, queries: ArrayLike, context: ArrayLike,
                   detail: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[ArrayLike, ArrayLike]:
        """(attention FLOPs, KV bytes read) of `seqs` sequences with `queries` new tokens each ending at
        `context`; with `detail` = (queries, context) per sequence, summed exactly (whole-number
        arrays are looked up in the piece's AttentionTables)."""
        arch = piece.arch
        if detail is not None:
            q, c = detail                     # q: per sequence, or one whole number for all
            # a few sequences as Python whole numbers (lists from step_time_s, or small integer arrays):
            # plain Python look-ups, the same bits
            if type(c) is list or (c.dtype.kind in "iu" and len(c) <= piece.cost.tables.MAX_ROWS
                                   and (type(q) is int or (isinstance(q, np.ndarray) and q.dtype.kind in "iu"))):
                cs = c if type(c) is list else c.tolist()
                if type(q) is int:
                    return piece.cost.tables.sums(q, [x if x >= q else q for x in cs])
                qs = q if type(q) is list else q.tolist()
                return piece.cost.tables.sums(qs, [x if x >= y else y for x, y in zip(cs, qs)])
            c = np.maximum(c, q)
            if c.dtype.kind in "iu" and (isinstance(q, int) or q.dtype.kind in "iu"):
                tables = piece.cost.tables
                return float(np.add.reduce(tables.flops(q, c))), float(np.add.reduce(tables.kv[c]))   # .sum(), unwrapped
            q, c = np.broadcast_to(q, c.shape).astype(float), c.astype(float)
            return float(arch.attention_flops(q, c).sum()), float(arch.kv_read_bytes(c).sum())
        q = np.asarray(queries, dtype=float)
        c = np.maximum(np.asarray(context, dtype=float), q)
        flops = seqs * np.where(seqs > 0, arch.attention_flops(np.minimum(q, c), c), 0.0)
        return flops, seqs * np.where(seqs > 0, arch.kv_read_bytes(c), 0.0)

    def _parts(self, B: ArrayLike, T: ArrayLike, C: ArrayLike, N: ArrayLike,
               detail: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, ArrayLike]:
        """Seconds by part. Scalars are priced in Python floats and arrays elementwise (unused parts
        are 0.0): the same arithmetic either way, so a step costs the same bits in both."""
        if not (type(B) is float and type(T) is float and type(C) is float and type(N) is float):   # (a step's)
            B, T, C, N = (_scalar_or_array(x) for x in (B, T, C, N))
        on = (N > 0) & (B > 0)
        parts: dict[str, ArrayLike] = dict.fromkeys(PART_KEYS, 0.0)
        m = self.method
        if m.kind == "cpu":
            parts["cpu"] = self.params["cpu_us_per_seq"] * 1e-6 * B * on
            return parts
        safe_b = fast_maximum(B, 1.0)
        c_mean = C / safe_b
        if m.kind == "sequential":
            head = self._linear(self._head, B, B, B) * (B > 0)      # _gemm's linear part (no attention)
            extra = self._extra_first_pass_tokens
            t1 = T + extra * B
            d1 = dl = None
            if detail is not None:
                d1 = _shifted(detail, extra) if extra else detail
                dl = (1, detail[1])
            a1 = self._attention(self._first, B, t1 / safe_b, c_mean + extra, d1)
            g1, at1 = self._gemm(self._first, t1, B, B, *a1)
            al = self._attention(self._later, B, np.ones_like(B) if isinstance(B, np.ndarray) else 1.0, c_mean, dl)
            gl, atl = self._gemm(self._later, B, B, B, *al)
            later = fast_maximum(N - 1.0, 0.0)
            parts["passes"] = g1 + later * gl
            parts["attention"] = at1 + later * atl
            parts["lm_head"] = N * head
            parts["overhead"] = N * self._overhead_s
        else:  # parallel_block
            q = N + self._queries_per_seq_offset
            gc, _ = self._gemm(self._context, T, B, 0.0)
            dq = None
            if detail is not None:
                qd = q.flat[0] if isinstance(q, np.ndarray) else q
                qd = int(qd) if float(qd).is_integer() else float(qd)
                c = detail[1]
                dq = (qd, [x + qd for x in c] if type(c) is list and type(qd) is int else np.asarray(c) + qd)
            aq = self._attention(self._later, B, q, c_mean + q, dq)
            gq, atq = self._gemm(self._later, B * q, B, 0.0, *aq)
            rows = B * N
            gh, _ = self._gemm(self._head, rows, B, rows)
            parts["passes"] = gc + gq
            parts["attention"] = atq
            parts["lm_head"] = gh
            parts["overhead"] = self._overhead_s
            if self._markov is not None:
                gm, _ = self._gemm(self._markov, B, B, B)
                parts["markov"] = N * gm
                parts["overhead"] = parts["overhead"] + N * self.params.get("markov_step_overhead_us", 0.0) * 1e-6
        return parts if on is True else {k: v * on for k, v in parts.items()}   # (v * True is v)

    def parts(self, num_decode_seqs: ArrayLike, target_tokens: ArrayLike, context_tokens_sum: ArrayLike,
              num_spec: ArrayLike) -> dict[str, float | np.ndarray]:
        """Seconds by part (PART_KEYS: passes = drafter linear layers incl. fc/context projection and
        all-reduces, lm_head, attention, markov, cpu, overhead) for the arguments of `time_s`."""
        args = (num_decode_seqs, target_tokens, context_tokens_sum, num_spec)
        p = self._parts(*args)
        shape = np.broadcast_shapes(*(np.shape(x) for x in args))
        return {k: float(v) for k, v in p.items()} if shape == () else {k: _shaped(v, shape) for k, v in p.items()}

    def time_s(self, num_decode_seqs: ArrayLike, target_tokens: ArrayLike, context_tokens_sum: ArrayLike,
               num_spec: ArrayLike) -> float | np.ndarray:
        """Drafting time of a step: `num_decode_seqs` requests (B) proposing `num_spec` (N) tokens each,
        `target_tokens` (T) tokens in the target forward (prefill included), `context_tokens_sum` (C)
        = Σ context of those requests. 0 when N = 0 or B = 0. Arrays of equal shape price many steps."""
        args = (num_decode_seqs, target_tokens, context_tokens_sum, num_spec)
        total = sum(self._parts(*args).values())
        shape = np.broadcast_shapes(*(np.shape(x) for x in args))
        return float(total) if shape == () else _shaped(total, shape)

    def steps_time_s(self, num_decode_seqs: int, target_tokens: float, context_tokens_sum: np.ndarray,
                     num_spec: int) -> np.ndarray:
        """`time_s` of many steps that differ only in their whole-number context sums C, memoised in
        blocks of C per (B, T, N): runs of decode steps ask for the same few (B, T, N) again and again,
        and one call over a block costs about what one run's call costs. Large batches, whose keys
        rarely come back, are priced directly."""
        key = (int(num_decode_seqs), float(target_tokens), int(num_spec))
        if key[0] > self._MEMO_MAX_SEQS:
            return self.time_s(float(key[0]), key[1], context_tokens_sum.astype(float), float(key[2]))
        size = min(self._MEMO_BLOCK_PER_SEQ * key[0], self._MEMO_MAX_BLOCK)    # C grows with B
        few = context_tokens_sum.tolist() if len(context_tokens_sum) < 32 else None   # a few: plain Python
        lo, hi = (min(few), max(few)) if few else (int(context_tokens_sum.min()), int(context_tokens_sum.max()))
        lo, hi = lo // size, hi // size
        blocks = self._steps_memo.setdefault(key, {})
        for b in range(lo, hi + 1):
            if b not in blocks:
                blocks[b] = self.time_s(float(key[0]), key[1], np.arange(b * size, (b + 1) * size, dtype=float),
                                        float(key[2]))
        table = blocks[lo] if lo == hi else np.concatenate([blocks[b] for b in range(lo, hi + 1)])
        return table[context_tokens_sum - lo * size]

    def step_time_s(self, new_tokens: np.ndarray | list[int], context_tokens: np.ndarray | list[int],
                    num_spec: int) -> float:
        """Drafting time of one step from per-request arrays (exact attention per request), or from
        Python lists of whole numbers for a few requests (at most AttentionTables.MAX_ROWS: the engine's
        mixed steps, priced in plain Python without numpy's per-call cost; the same bits)."""
        if type(new_tokens) is list and type(context_tokens) is list:
            if not new_tokens or num_spec <= 0:
                return 0.0
            p = self._parts(float(len(new_tokens)), float(sum(new_tokens)), float(sum(context_tokens)),
                            float(num_spec), detail=(new_tokens, context_tokens))
            return float(sum(p.values()))
        new_tokens = np.asarray(new_tokens)
        context_tokens = np.asarray(context_tokens)
        if len(new_tokens) == 0 or num_spec <= 0:
            return 0.0
        whole = new_tokens.dtype.kind in "iu" and context_tokens.dtype.kind in "iu"
        p = self._parts(len(new_tokens), int_sum(new_tokens) if whole else new_tokens.sum(),
                        int_sum(context_tokens) if whole else context_tokens.sum(), num_spec,
                        detail=(new_tokens, context_tokens))
        return float(sum(p.values()))


def _scalar_or_array(x: ArrayLike) -> float | np.ndarray:
    """A scalar as a Python float, anything else as a float array (see DraftCost._parts)."""
    if type(x) is float:
        return x
    if isinstance(x, np.ndarray):
        return float(x) if x.ndim == 0 else x.astype(float, copy=False)
    return float(x) if isinstance(x, (int, float, np.number)) else np.asarray(x, dtype=float)


def _shifted(detail: tuple, extra: float) -> tuple:
    """Per-request (queries, context) of `DraftCost._parts`' detail with `extra` more of each (Python
    lists stay lists when extra is a whole number)."""
    q, c = detail
    if type(c) is list:
        if type(extra) is not int:
            return np.asarray(q) + extra, np.asarray(c) + extra
        return (q + extra if type(q) is int else [x + extra for x in q]), [x + extra for x in c]
    return q + extra, c + extra


def _shaped(x: ArrayLike, shape: tuple[int, ...]) -> np.ndarray:
    return np.array(np.broadcast_to(x, shape), dtype=float)


# --------------------------------------------------------------------------------------------------
# The engine's Speculation
# --------------------------------------------------------------------------------------------------

class SpeculativeDecoding:
    """Speculative decoding as the engine sees it: a policy picks N per step, the DraftCost prices the
    drafter, the acceptance model draws accepted drafts.

    `lookahead_tokens` returns the configured maximum N for methods that reserve lookahead slots,
    whatever this step's N: vLLM's scheduler passes the constant `num_lookahead_tokens` =
    num_speculative_tokens to every allocate_slots call (methods.yaml [sched]).
    """

    def __init__(self, method: DraftMethod, draft_cost: DraftCost, acceptance: Any, policy: SpeculationPolicy,
                 num_speculative_tokens: int):
        self.method = method
        self.draft_cost = draft_cost
        self.acceptance = acceptance
        self.policy = policy
        self.num_speculative_tokens = int(num_speculative_tokens)
        self._last_mean_context = 0.0
        self._stateless_acceptance: bool | None = None

    @property
    def weight_bytes(self) -> float:
        """Draft weights held in HBM, all TP ranks together."""
        return self.draft_cost.weight_bytes

    @property
    def extra_kv_bytes_per_token(self) -> float:
        """Drafter KV cache per context token (full-attention layers; see `extra_kv_cache_bytes`)."""
        return self.draft_cost.extra_kv_bytes_per_token

    def extra_kv_cache_bytes(self, context_tokens: ArrayLike) -> np.ndarray:
        """Drafter cache bytes per sequence (all TP ranks) at each context length, sliding layers capped."""
        return self.draft_cost.extra_kv_cache_bytes(context_tokens)

    def num_spec_tokens(self, batch_size: int, mean_context: float | None = None) -> int:
        """Draft tokens per decoding request this step. `mean_context` defaults to the mean context of
        the last step priced by `draft_time`."""
        ctx = self._last_mean_context if mean_context is None else float(mean_context)
        return int(self.policy.num_spec_tokens(int(batch_size), ctx))

    def lookahead_tokens(self, num_spec_tokens: int) -> int:
        return self.num_speculative_tokens if self.method.reserves_lookahead else 0

    def draft_time(self, ids: np.ndarray, new_tokens: np.ndarray, context_tokens: np.ndarray,
                   num_spec: np.ndarray) -> StepTime:
        """The drafter runs over every scheduled request (vLLM's padded drafter batch). Its N is this
        step's verification width when any request verifies drafts, else what the policy picks for
        this batch (a step of prefills still drafts for the requests whose prompt completes)."""
        if len(ids) == 0:
            return StepTime({})
        few = len(ids) <= AttentionTables.MAX_ROWS
        if not (few and type(context_tokens) is list and type(new_tokens) is list):   # lists: whole numbers
            context_tokens = np.asarray(context_tokens)
            new_tokens = np.asarray(new_tokens)
            few = few and context_tokens.dtype.kind in "iu" and new_tokens.dtype.kind in "iu"
            if few:
                context_tokens, new_tokens = context_tokens.tolist(), new_tokens.tolist()
        if few:                                 # the engine's steps: Python lists, priced in plain Python
            self._last_mean_context = sum(context_tokens) / len(context_tokens)
        else:
            whole = context_tokens.dtype.kind in "iu"
            self._last_mean_context = int_sum(context_tokens) / len(context_tokens) if whole \
                else float(context_tokens.mean())   # the same number, faster
        if type(num_spec) is list or isinstance(num_spec, np.ndarray):
            n = max(num_spec if type(num_spec) is list else num_spec.tolist(), default=0)
        else:
            n = int(np.max(num_spec, initial=0))
        if n <= 0:
            n = self.num_spec_tokens(len(ids), self._last_mean_context)
        if n <= 0:
            return StepTime({})
        return StepTime({"draft": self.draft_cost.step_time_s(new_tokens, context_tokens, n)})

    def sample_accepted(self, ids: np.ndarray, num_spec: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(self.acceptance.sample(ids, num_spec, rng), dtype=np.int64)

    @property
    def supports_runs(self) -> bool:
        """Decode runs can be fast-forwarded when acceptance keeps no per-request state (sampling
        several steps ahead then costs nothing in fidelity)."""
        if self._stateless_acceptance is None:   # asked before every engine step: answered once
            from capacity.spec.acceptance import _Stateless

            self._stateless_acceptance = isinstance(self.acceptance, _Stateless)
        return self._stateless_acceptance

    def sample_steps(self, ids: np.ndarray, num_spec: int, num_steps: int, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(self.acceptance.sample_steps(ids, num_spec, num_steps, rng), dtype=np.int64)

    def skip_steps(self, ids: np.ndarray, num_spec: int, num_steps: int, rng: np.random.Generator) -> None:
        self.acceptance.skip_steps(ids, num_spec, num_steps, rng)   # (runs need a stateless model: supports_runs)

    def draft_time_steps(self, num_seqs: int, target_tokens: np.ndarray, context_sum: np.ndarray,
                         num_spec: int) -> np.ndarray:
        if num_spec > 0 and isinstance(num_seqs, (int, np.integer)) and isinstance(target_tokens, (float, int)) \
                and isinstance(context_sum, np.ndarray) and context_sum.dtype.kind in "iu":
            return self.draft_cost.steps_time_s(num_seqs, target_tokens, context_sum, num_spec)  # the engine's runs
        shape = np.broadcast_shapes(np.shape(target_tokens), np.shape(context_sum))
        if num_spec <= 0:
            return np.zeros(shape)
        seqs = np.broadcast_to(np.asarray(num_seqs, dtype=float), shape)
        return np.asarray(self.draft_cost.time_s(seqs, target_tokens, context_sum, num_spec), dtype=float)


def _as_dict(cfg: Any) -> dict[str, Any]:
    if cfg is None:
        return {}
    if hasattr(cfg, "model_dump"):
        return dict(cfg.model_dump())
    if not isinstance(cfg, Mapping):
        raise CapacityError("the speculative section must be a mapping with method and num_speculative_tokens")
    return dict(cfg)


def resolve_draft(method: DraftMethod, target: ModelArch, draft: str | None) -> ModelArch | None:
    """The draft architecture for `method` on `target`: the given id/path or the seed article's default."""
    if method.drafter != "checkpoint":
        return None
    name = draft or method.default_draft(target.name)
    if not name:
        known = ", ".join(method.default_drafts) or "none"
        raise CapacityError(f"no default {method.name} draft for {target.name} (defaults exist for: {known}); "
                            f"set speculative.draft to a draft checkpoint id or a config.json path")
    return load_model(name, kv_dtype=target.kv_dtype)


def build_speculation(spec_cfg: Any, gpu: GpuProfile, target: ModelArch, tp: int,
                      model_runner: str = "v1") -> Speculation:
    """The engine's Speculation for a scenario's `speculative` section
    {method, num_speculative_tokens, draft, acceptance, policy[, overrides]}.

    method 'none' or N = 0 gives NoSpeculation. `overrides` sets method parameters (e.g.
    {draft_pass_overhead_us: 80}). method 'mtp' with a Gemma 4 assistant draft means gemma4_mtp (as in
    vLLM, where Gemma 4 MTP is method 'mtp' with a model)."""
    cfg = _as_dict(spec_cfg)
    name = str(cfg.get("method") or "none").strip().lower()
    n = int(cfg.get("num_speculative_tokens") or 0)
    if n < 0:
        raise CapacityError(f"speculative.num_speculative_tokens is {n}; use 0 (off) or a positive number")
    if name in _NO_SPECULATION or n == 0:
        return NoSpeculation()
    method = get_method(name)
    draft_name = cfg.get("draft")
    if method.name == "mtp" and draft_name:
        method = get_method("gemma4_mtp")
    draft = resolve_draft(method, target, str(draft_name) if draft_name else None)
    policy_cfg = cfg.get("policy")
    n_max = n
    if isinstance(policy_cfg, Mapping) and str(policy_cfg.get("kind", "")).lower() == "goodput" \
            and policy_cfg.get("max_n") is not None:
        n_max = int(policy_cfg["max_n"])
    overrides = cfg.get("overrides") or cfg.get("method_overrides")
    draft_cost = DraftCost(method, gpu, target, draft, tp, max(n, n_max), overrides)

    from capacity.spec.acceptance import acceptance_from_config   # written alongside; imported lazily

    acc_cfg = cfg.get("acceptance")
    acc_dict = acc_cfg if isinstance(acc_cfg, Mapping) else {}
    kwargs: dict[str, Any] = {}
    if acc_dict.get("dataset") is not None:
        kwargs["dataset"] = acc_dict["dataset"]
    if acc_dict.get("temperature") is not None:
        kwargs["temperature"] = float(acc_dict["temperature"])
    acceptance = acceptance_from_config(acc_cfg, method=method.name, target=target.name, **kwargs)
    policy = policy_from_config(policy_cfg, n, target_cost=StepCostModel(gpu, target, tp, model_runner=model_runner), draft_cost=draft_cost,
                                acceptance=acceptance)
    return SpeculativeDecoding(method, draft_cost, acceptance, policy, policy.max_num_spec_tokens)
