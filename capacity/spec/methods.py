"""Drafting methods as data: `capacity/data/methods.yaml` describes each method (mtp, gemma4_mtp,
eagle3, dflash, dspark, draft_model, ngram): what the drafter is, how vLLM v1 runs it (with the vLLM
source lines), how many KV slots it reserves ahead, which N it allows, the default draft checkpoint
per target (seed article), its `assumed` overhead parameters, and the other spellings of its name
(`aliases`: "EAGLE-3", "Native MTP", ...). `get_method` / `list_methods` / `methods_table` /
`canonical_name`, and the checks of a (method, target, draft, N) combination.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping

import yaml

from capacity.errors import CapacityError
from capacity.inputs.models import ModelArch
from capacity.paths import data_dir

_KINDS = ("sequential", "parallel_block", "cpu")
_MAX_N_RULES = ("none", "mtp_modules", "block_size_minus_1")
_DRAFTERS = ("target_mtp", "checkpoint", "none")
_REQUIRES = (None, "native_mtp", "target_model_type_gemma4", "same_vocab")
NO_SPECULATION = ("none", "off", "")
"""Method names that mean plain decoding."""


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
    aliases: tuple[str, ...] = ()     # other spellings of the name, lower case ("eagle-3", "native mtp")

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
            parameters=params,
            aliases=tuple(str(a).strip().lower() for a in (e.get("aliases") or ()))))
    return tuple(out)


def list_methods() -> list[DraftMethod]:
    """Every drafting method in capacity/data/methods.yaml, in file order."""
    return list(_load_methods(_methods_file()))


def find_method(label: Any) -> DraftMethod | None:
    """The method written `label` (its name, its label such as "EAGLE-3", or one of its `aliases`;
    case-insensitive, '-' and '_' alike in names), or None."""
    key = str(label).strip().lower()
    for m in list_methods():
        if key in (m.name, m.label.lower()) or key.replace("-", "_") == m.name or key in m.aliases:
            return m
    return None


def canonical_name(label: Any) -> str:
    """The methods.yaml name of a method written any accepted way: its name, its label ("EAGLE-3",
    "Native MTP"), or one of its `aliases` (case-insensitive; '-' and '_' alike in names)."""
    return get_method(label).name


# vLLM's SpeculativeConfig.use_eagle(): `return self.method in ("eagle", "eagle3", "mtp", "dflash",
# "dspark")` (vllm-project/vllm vllm/config/speculative.py @002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443):
# drafters fed the target's hidden states. With prefix caching such a request gives back its last
# matched block (vllm/v1/core/single_type_kv_cache_manager.py, FullAttentionManager.find_longest_cache_hit:
# "Need to drop the last matched block if eagle is enabled").
USE_EAGLE_METHODS = frozenset({"eagle", "eagle3", "mtp", "dflash", "dspark"})


def uses_target_hidden_states(method: DraftMethod | None) -> bool:
    """vLLM's use_eagle() for this method (its vllm_method's first word, e.g. "mtp" for Gemma 4 MTP)."""
    return method is not None and method.vllm_method.split()[0] in USE_EAGLE_METHODS


def get_method(name: Any) -> DraftMethod:
    """A method by name, label or alias (see `canonical_name`)."""
    found = find_method(name)
    if found is None:
        known = ", ".join(f"{m.name} ({m.label})" for m in list_methods())
        raise CapacityError(f"unknown speculative method '{name}'; use one of: {known} (or 'none')")
    return found


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


