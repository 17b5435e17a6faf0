"""Read the files real tools write into serving rows and acceptance records ("bring your own measurements").

Formats, detected from the content (`detect_format`), never from the file name:

* ``vllm_result``: `vllm bench serve --save-result` JSON (`--save-detailed` adds per-request
  `input_lens`, `output_lens`, `ttfts`, `itls`, `start_times`), one object per file, or one per line
  (`--append-result`). Keys as written by vLLM's `vllm/benchmarks/serve.py` (`main_async` builds
  `result_json`: date, backend, model_id, num_prompts, the `--metadata KEY=VALUE` pairs,
  request_rate ("inf" or a number), burstiness, max_concurrency, then `benchmark()`'s result:
  duration, completed, failed, total_input_tokens, total_output_tokens, request_throughput,
  output_throughput, total_token_throughput, and `{mean,median,std,pXX}_{ttft,tpot,itl,e2el}_ms`),
  read at commit 009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1. The older `benchmarks/benchmark_serving.py`
  wrote the same keys without `failed` and with the typo ``request_goodput:``; both are read.
* ``prometheus``: the text exposition of a vLLM server's ``/metrics`` with the speculative-decoding
  counters ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
  ``..._num_accepted_tokens_total`` and ``..._num_accepted_tokens_per_pos_total{position="k"}``
  (vllm/v1/spec_decode/metrics.py `SpecDecodingProm`); ``_created`` timestamps are ignored and the
  engines of a data-parallel server are summed, as `vllm bench serve`'s `fetch_spec_decode_metrics`.
* ``vllm_log``: a server log with the periodic ``SpecDecoding metrics: Mean acceptance length: ...,
  Accepted: A tokens, Drafted: D tokens, Per-position acceptance rate: r1, r2, ...`` lines
  (vllm/v1/spec_decode/metrics.py `SpecDecodingLogging.log`).
* ``serving_csv`` / ``spec_csv``: the project's measurement schemas
  (capacity/data/measurements/README.md; `capacity.measurements.schemas`).

A vLLM result becomes one row of the serving-measurement schema, plus what only vLLM gives: the
exact per-request lengths (`input_lens`, `output_lens`, replayed by the simulator), the send times
(`start_times`) of an open-loop run, the burstiness, and engine limits from metadata. vLLM's JSON
does not say which GPU, TP size or engine version served it: those come from well-named
``--metadata`` keys (gpu, tensor_parallel_size/tp, max_num_batched_tokens, max_num_seqs,
vllm_version, precision, replicas) or from the caller (`Overrides`).

Speculative-decoding counters become an `AcceptanceRecord`: per-position accepted counts over the
number of drafts are the marginal rates S_k = P(accepted length >= k) (the same quotient vLLM logs
as "Per-position acceptance rate"), conditional rates a_k = S_k / S_{k-1}, and the mean acceptance
length 1 + accepted / drafts.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prometheus_client.parser import text_string_to_metric_families

from capacity.errors import CapacityError
from capacity.inputs.models import load_model
from capacity.measurements.schemas import (MAX_PROMPTS, MAX_TOKENS, MAX_TP, SERVING_REQUIRED, SPEC_REQUIRED,
                                           bad_value, check_name, check_number, check_serving_row, is_spec_file,
                                           model_aliases, parse_float, read_measurements)
from capacity.util.text import quote

MAX_FILE_BYTES = 256 * 2**20     # one measurement file (the shipped serving CSV is about 1 MB)
FORMATS = ("vllm_result", "prometheus", "vllm_log", "serving_csv", "spec_csv")

# Keys every `vllm bench serve` / benchmark_serving.py result has (both versions).
RESULT_REQUIRED = ("duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                   "output_throughput")
# The percentile statistic keys vLLM writes: {mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms.
_STAT_KEY = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
_SPEC_LOG = re.compile(r"SpecDecoding metrics:(?P<body>.*)$")
_SPEC_LOG_V0 = re.compile(r"Speculative metrics: Draft acceptance rate")

METADATA_TP = ("tensor_parallel_size", "tp", "tp_size")
METADATA_GPU = ("gpu", "gpu_name", "hardware")
METADATA_VERSION = ("vllm_version", "engine_version", "framework_version")
METADATA_ENGINE = ("max_num_batched_tokens", "max_num_seqs")
METADATA_REPLICAS = ("replicas", "num_replicas", "data_parallel_size")


@dataclass
class Overrides:
    """What the caller knows that a vLLM result does not say (CLI --gpu, --tp, --model, --set)."""

    gpu: str | None = None
    tp: int | None = None
    model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)   # any row column, e.g. precision=fp8


# --------------------------------------------------------------------------------------------
# Detection
# --------------------------------------------------------------------------------------------


def _text(path: Path) -> str:
    try:
        is_file = path.is_file()
    except (OSError, ValueError):        # a name too long for the file system
        is_file = False
    if not is_file:
        raise CapacityError(f"measurement file {quote(str(path))} not found")
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise CapacityError(f"{path}: {size:,} bytes, more than {MAX_FILE_BYTES:,}; split the measurements into "
                                f"smaller files")
        return path.read_text(errors="replace")
    except OSError as e:
        raise CapacityError(f"{path}: cannot read it ({e.strerror or e})") from None


def _json_objects(text: str) -> list[Any] | None:
    """One JSON value, or one per line (--append-result); None if the text is not JSON."""
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, list) else [doc]
    except json.JSONDecodeError:
        pass
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            return None
    return out or None


def detect_format(path: str | Path) -> str:
    """The format of a measurement file (one of FORMATS), from its content; unknown is a one-line error."""
    path = Path(path)
    text = _text(path)
    head = text.lstrip()[:1]
    if head in ("{", "["):
        objs = _json_objects(text)
        if objs is None:
            raise CapacityError(f"{path}: looks like JSON but does not parse; give a `vllm bench serve --save-result` file")
        if all(isinstance(o, dict) and "completed" in o and "duration" in o for o in objs):
            return "vllm_result"
        raise CapacityError(f"{path}: a JSON file but not a `vllm bench serve --save-result` result "
                            f"(no 'completed'/'duration' keys); unknown format")
    lines = text.splitlines()
    if any(re.match(r"^\s*(#\s*(HELP|TYPE)\s+)?vllm:\w+", ln) for ln in lines[:2000]):
        return "prometheus"
    if _SPEC_LOG.search(text) or _SPEC_LOG_V0.search(text):
        return "vllm_log"
    if is_spec_file(path):
        return "spec_csv"
    try:
        header = pd.read_csv(path, nrows=0).columns
    except Exception:  # noqa: BLE001 - any parse failure means "not a CSV we know"
        header = []
    if all(c in header for c in SERVING_REQUIRED):
        return "serving_csv"
    # most of one schema's columns: read it as that kind, whose reader names the missing columns
    for kind, required in (("spec_csv", SPEC_REQUIRED), ("serving_csv", SERVING_REQUIRED)):
        if sum(c not in header for c in required) <= len(required) // 2:
            return kind
    raise CapacityError(f"{path}: unknown measurement format; give a `vllm bench serve --save-result` JSON, a "
                        f"Prometheus /metrics dump, a vLLM server log with 'SpecDecoding metrics' lines, or a CSV "
                        f"in the schema of capacity/data/measurements/README.md")


# --------------------------------------------------------------------------------------------
# vllm bench serve results -> serving rows
# --------------------------------------------------------------------------------------------


def _first(d: dict, keys: tuple[str, ...]) -> Any:
    for k in keys:
        if d.get(k) not in (None, ""):
            return d[k]
    return None


def _date(value: Any) -> str:
    try:
        return datetime.strptime(str(value), "%Y%m%d-%H%M%S").date().isoformat()
    except ValueError:
        return str(value or "")


def resolve_model(name: str) -> str:
    """A result's model id as a shipped architecture: as given, through model_aliases.yaml, or without an
    "-Instruct"/"-Chat" suffix (an instruction-tuned checkpoint has its base model's architecture)."""
    check_name("model", "the model name", name)
    candidates = [name, model_aliases().get(name, name)]
    candidates += [re.sub(r"-(Instruct|Chat|chat|instruct)(-\d+)?$", "", c) for c in candidates]
    for c in candidates:
        try:
            load_model(c)
            return c
        except CapacityError:
            continue
    return name   # unknown: the row is reported as skipped with the loader's reason


def result_to_row(res: dict[str, Any], path: Path, index: int, ov: Overrides) -> dict[str, Any]:
    """One `vllm bench serve` result as a serving-measurement row (see module docstring)."""
    where = f"{path}" + (f" (result {index + 1})" if index else "")
    missing = [k for k in RESULT_REQUIRED if k not in res]
    if missing or not any(_STAT_KEY.match(k) for k in res):
        raise CapacityError(f"{where}: unknown `vllm bench serve` result version: missing "
                            f"{', '.join(missing) or 'the *_ttft_ms/*_tpot_ms statistics'}")
    _check_result(res, where)
    completed = int(parse_float(res["completed"]))
    failed = parse_float(res.get("failed"))
    if math.isnan(failed):  # benchmark_serving.py before `failed` existed: infer from num_prompts
        n = parse_float(res.get("num_prompts"))
        failed = n - completed if not math.isnan(n) and n > completed and "input_lens" not in res else 0
    if failed > 0 or completed <= 0:
        raise CapacityError(f"{where}: {int(failed)} of {completed + int(failed)} requests failed; its latencies and "
                            f"throughput are not a clean measurement: fix the server and re-run the benchmark")
    if res.get("ramp_up_strategy"):
        raise CapacityError(f"{where}: a ramp-up run (--ramp-up-strategy) has no single load; benchmark at a "
                            f"fixed --request-rate or --max-concurrency")
    gpu = ov.gpu or _first(res, METADATA_GPU)
    tp = ov.tp if ov.tp is not None else parse_float(_first(res, METADATA_TP))
    if tp is None or (isinstance(tp, float) and math.isnan(tp)):
        raise CapacityError(f"{where}: tensor-parallel size unknown: pass --tp N, or run vllm bench serve with "
                            f"--metadata tensor_parallel_size=N")
    model = resolve_model(str(ov.model or res.get("model_id") or res.get("model") or ""))
    replicas = parse_float(_first(res, METADATA_REPLICAS))
    replicas = int(replicas) if not math.isnan(replicas) and replicas >= 1 else 1
    rate = parse_float(res.get("request_rate", "inf"))
    conc = parse_float(res.get("max_concurrency"))
    burst = parse_float(res.get("burstiness", 1.0))
    if math.isinf(rate) and not math.isnan(conc):
        load_type, load = "closed_loop (vllm bench serve --max-concurrency)", conc
    elif math.isinf(rate):
        load_type, load = "burst (all requests at t=0, --request-rate inf)", math.inf
    elif not math.isnan(conc):
        load_type, load = "rate_and_concurrency (not modelled)", rate
    elif burst == 1.0 or math.isnan(burst):
        load_type, load = "poisson (vllm bench serve --request-rate)", rate
    else:
        load_type, load = "gamma (vllm bench serve --burstiness)", rate
    num_gpus = int(tp) * replicas
    med = lambda m: parse_float(res.get(f"median_{m}_ms"))  # noqa: E731
    row: dict[str, Any] = {
        "file": path.name, "row": index, "source_id": f"{path.name}" + (f"#{index + 1}" if index else ""),
        "source_url": str(path), "gpu": str(gpu or ""), "num_gpus": num_gpus, "model": str(model or ""),
        "precision": str(res.get("precision", "") or ""), "framework": "vllm",
        "framework_version": str(_first(res, METADATA_VERSION) or ""), "tp": int(tp),
        "concurrency_or_qps": load, "load_type": load_type, "burstiness": burst,
        "num_prompts": completed, "latency_stat": "median", "date": _date(res.get("date")),
        "ttft_ms": med("ttft"), "tpot_ms": med("tpot"), "e2e_ms": med("e2el"), "itl_median_ms": med("itl"),
        "ttft_p99_ms": parse_float(res.get("p99_ttft_ms")), "tpot_p99_ms": parse_float(res.get("p99_tpot_ms")),
        "output_tok_s_per_gpu": parse_float(res["output_throughput"]) / num_gpus,
        "total_tok_s_per_gpu": parse_float(res.get("total_token_throughput")) / num_gpus,
        "tok_s_per_user": 1000.0 / med("tpot") if med("tpot") > 0 else math.nan,
        "spec_method": "none", "format": "vllm_result",
    }
    spec = res.get("speculative_config")
    if spec not in (None, "", "none", "None", "null"):
        row["spec_method"] = str(spec)
    for key in METADATA_ENGINE:
        if res.get(key) not in (None, ""):
            row[key] = int(parse_float(res[key]))
    ins, outs = res.get("input_lens"), res.get("output_lens")
    if isinstance(ins, list) and isinstance(outs, list) and len(ins) == len(outs) and ins:
        ok = [o > 0 for o in outs]          # vLLM writes output_len 0 for failed requests
        row["input_lens"] = [int(i) for i, k in zip(ins, ok) if k]
        row["output_lens"] = [int(o) for o, k in zip(outs, ok) if k]
        starts = res.get("start_times")
        if isinstance(starts, list) and len(starts) == len(ins):
            row["start_times"] = [float(s) for s, k in zip(starts, ok) if k]
        row["isl"] = float(np.mean(row["input_lens"]))
        row["osl"] = float(np.mean(row["output_lens"]))
    else:   # no per-request lengths: mean lengths (or the random dataset's --metadata input_len/output_len)
        row["isl"] = parse_float(res.get("input_len")) if "input_len" in res else parse_float(res["total_input_tokens"]) / completed
        row["osl"] = parse_float(res.get("output_len")) if "output_len" in res else parse_float(res["total_output_tokens"]) / completed
    row.update(ov.extra)
    check_serving_row(row, where)
    return row


def _check_result(res: dict[str, Any], where: str) -> None:
    """The keys of a `vllm bench serve` result the reader uses, as vLLM writes them: counts whole and >= 0,
    durations and rates finite (request_rate may be "inf"), statistics finite and >= 0, lengths whole."""
    for key in ("completed", "total_input_tokens", "total_output_tokens"):
        check_number(where, key, res[key], whole=True, high=MAX_PROMPTS * MAX_TOKENS)
    for key in ("failed", "num_prompts"):
        if res.get(key) is not None:
            check_number(where, key, res[key], whole=True, high=MAX_PROMPTS)
    check_number(where, "duration", res["duration"], low_open=True)
    for key in ("request_throughput", "output_throughput", "total_token_throughput"):
        if key in res or key in RESULT_REQUIRED:
            check_number(where, key, res[key])
    for key, value in res.items():
        if _STAT_KEY.match(key) and value is not None:
            check_number(where, key, value)
    if "request_rate" in res and res["request_rate"] is not None:
        check_number(where, "request_rate", res["request_rate"], low_open=True, allow_inf=True)
    if res.get("max_concurrency") is not None:
        check_number(where, "max_concurrency", res["max_concurrency"], low=1, high=MAX_PROMPTS, whole=True)
    if res.get("burstiness") is not None:
        check_number(where, "burstiness", res["burstiness"], low_open=True)
    for key in METADATA_TP:
        if res.get(key) not in (None, ""):
            check_number(where, key, res[key], low=1, high=MAX_TP, whole=True)
    for key in METADATA_REPLICAS:
        if res.get(key) not in (None, ""):
            check_number(where, key, res[key], low=1, high=4096, whole=True)
    for key in ("model_id", "model", *METADATA_GPU):
        if res.get(key) not in (None, ""):
            check_name(where, key, res[key])
    for key in ("input_lens", "output_lens", "start_times"):
        value = res.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or len(value) > MAX_PROMPTS:
            raise bad_value(where, key, value, f"give a list of at most {MAX_PROMPTS:,} numbers (--save-detailed)")
        for x in value:
            if key == "start_times":
                check_number(where, key, x, low=-math.inf)
            else:
                check_number(where, key, x, whole=True, high=MAX_TOKENS)


def read_vllm_results(path: str | Path, ov: Overrides | None = None) -> pd.DataFrame:
    path = Path(path)
    objs = _json_objects(_text(path)) or []
    rows = [result_to_row(o, path, i, ov or Overrides()) for i, o in enumerate(objs)]
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Speculative-decoding counters -> acceptance records
# --------------------------------------------------------------------------------------------


@dataclass
class AcceptanceRecord:
    """Counted speculative-decoding outcomes of one source (a /metrics dump, a log, a result JSON)."""

    source: str
    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    accepted_per_pos: np.ndarray          # accepted count at draft position k (0-based), summed
    note: str = ""

    @property
    def num_spec_tokens(self) -> int:
        return len(self.accepted_per_pos)

    @property
    def marginal(self) -> np.ndarray:
        """S_k = P(accepted length >= k), k = 1..N."""
        return self.accepted_per_pos / self.num_drafts

    @property
    def conditional(self) -> np.ndarray:
        s = self.marginal
        prev = np.concatenate([[1.0], s[:-1]])
        return np.divide(s, prev, out=np.zeros_like(s), where=prev > 0)

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "num_spec_tokens": self.num_spec_tokens, "num_drafts": self.num_drafts,
                "num_draft_tokens": self.num_draft_tokens, "num_accepted_tokens": self.num_accepted_tokens,
                "mean_acceptance_length": self.mean_acceptance_length,
                "marginal": self.marginal.round(4).tolist(), "conditional": self.conditional.round(4).tolist(),
                "note": self.note}


def _check_record(rec: AcceptanceRecord) -> AcceptanceRecord:
    counts = {"drafts": rec.num_drafts, "draft tokens": rec.num_draft_tokens, "accepted tokens": rec.num_accepted_tokens}
    for what, value in counts.items():
        if not (isinstance(value, (int, float, np.floating, np.integer)) and math.isfinite(value) and value >= 0):
            raise CapacityError(f"{rec.source}: the count of {what} is {quote(value)}; counters are finite and >= 0 "
                                f"(give the server's own /metrics or log)")
    per_pos = np.asarray(rec.accepted_per_pos, dtype=float)
    if not np.all(np.isfinite(per_pos)) or np.any(per_pos < 0):
        raise CapacityError(f"{rec.source}: per-position accepted counts must be finite and >= 0, got "
                            f"{quote(', '.join(f'{x:g}' for x in per_pos))}")
    if rec.num_drafts > 0 and np.any(per_pos > rec.num_drafts * (1 + 1e-6)):
        raise CapacityError(f"{rec.source}: more tokens accepted at a draft position than drafts made (acceptance "
                            f"rate above 1: {quote(', '.join(f'{x:.3f}' for x in per_pos / rec.num_drafts))}); "
                            f"counters from different runs mixed?")
    if rec.num_drafts > 0 and rec.num_accepted_tokens > rec.num_drafts * len(per_pos) * (1 + 1e-6):
        raise CapacityError(f"{rec.source}: {rec.num_accepted_tokens:g} accepted tokens over {rec.num_drafts:g} drafts "
                            f"of {len(per_pos)} positions is more than one per position; the per-position counters "
                            f"are incomplete (save the whole /metrics page or log)")
    if rec.num_accepted_tokens > rec.num_draft_tokens * (1 + 1e-6):
        raise CapacityError(f"{rec.source}: {rec.num_accepted_tokens:g} accepted tokens but only "
                            f"{rec.num_draft_tokens:g} drafted; accepted <= drafted (counters from different runs mixed?)")
    if not rec.num_drafts > 0:
        raise CapacityError(f"{rec.source}: the server made no speculative drafts (0 drafts counted); benchmark "
                            f"with speculative decoding on and traffic running before reading its metrics")
    if rec.num_spec_tokens == 0:
        raise CapacityError(f"{rec.source}: no per-position accepted counts; use vLLM >= 0.8.5 (per-position "
                            f"counters) or give the /metrics dump")
    if np.any(np.diff(rec.marginal) > 0.01):
        raise CapacityError(f"{rec.source}: per-position acceptance increases with the position "
                            f"({', '.join(f'{x:.3f}' for x in rec.marginal)}); counters from different runs mixed?")
    return rec


def _prom_samples(text: str, path: Path) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample of a Prometheus text exposition."""
    try:
        return [(s.name, dict(s.labels), float(s.value))
                for family in text_string_to_metric_families(text) for s in family.samples]
    except (ValueError, TypeError, IndexError) as exc:
        raise CapacityError(f"{path}: not a valid Prometheus text exposition ({exc}); save the server's /metrics "
                            f"page as it is (curl -s http://HOST:PORT/metrics > FILE)") from None


MAX_SPEC_POSITIONS = 64      # draft positions (as the scenario's speculative.num_speculative_tokens)


def _check_counter(path: Path, name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise CapacityError(f"{path}: {name} is {value:g}; a counter is finite and >= 0 (save the /metrics page as "
                            f"vLLM wrote it)")


def read_prometheus(path: str | Path) -> AcceptanceRecord:
    """Speculative-decoding counters of one /metrics dump (totals since the server started)."""
    path = Path(path)
    samples = _prom_samples(_text(path), path)
    total: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for name, labels, value in samples:
        if not name.startswith("vllm:spec_decode_") or not name.endswith("_total"):
            continue     # _created timestamps and older un-suffixed names are not counts
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            if "position" in labels:
                pos = labels["position"]
                if not (pos.isdigit() and int(pos) < MAX_SPEC_POSITIONS):
                    raise CapacityError(f"{path}: {name} has position=\"{quote(pos, 40)}\"; positions are whole "
                                        f"numbers 0..{MAX_SPEC_POSITIONS - 1} (save the /metrics page as vLLM wrote it)")
                _check_counter(path, name, value)
                k = int(pos)
                per_pos[k] = per_pos.get(k, 0.0) + value
            continue
        _check_counter(path, name, value)
        total[name] = total.get(name, 0.0) + value
    if not total:
        raise CapacityError(f"{path}: no vllm:spec_decode_*_total counters; was the server started with "
                            f"--speculative-config?")
    need = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total")
    missing = [n for n in need if n not in total]
    drafts = total.get("vllm:spec_decode_num_drafts_total", 0.0)
    if drafts <= 0 and "vllm:spec_decode_num_drafts_total" in total:
        raise CapacityError(f"{path}: vllm:spec_decode_num_drafts_total is 0: the server made no speculative "
                            f"drafts; send traffic before scraping /metrics")
    if missing or not per_pos:
        what = ", ".join(missing + ([] if per_pos else ["vllm:spec_decode_num_accepted_tokens_per_pos_total"]))
        raise CapacityError(f"{path}: incomplete speculative-decoding metrics, missing {what}; save the whole "
                            f"/metrics page (vLLM >= 0.8.5)")
    n = max(per_pos) + 1
    rec = AcceptanceRecord(str(path), drafts, total["vllm:spec_decode_num_draft_tokens_total"],
                           total["vllm:spec_decode_num_accepted_tokens_total"],
                           np.array([per_pos.get(k, 0.0) for k in range(n)]))
    return _check_record(rec)


def prometheus_totals(path: str | Path) -> dict[str, float]:
    """Every vllm:spec_decode_*_total counter of a dump, summed over engines (for inspection and tests)."""
    out: dict[str, float] = {}
    for name, _labels, value in _prom_samples(_text(Path(path)), Path(path)):
        if name.startswith("vllm:spec_decode_") and name.endswith("_total"):
            out[name] = out.get(name, 0.0) + value
    return out


def read_spec_log(path: str | Path) -> AcceptanceRecord:
    """Sum the periodic 'SpecDecoding metrics' lines of a vLLM server log.

    Each line covers one logging interval: Drafted = drafts x N (N = number of per-position rates), so
    drafts = Drafted / N exactly; accepted at position k = rate_k x drafts (rates are printed with 3
    decimals, so per-position counts carry a relative rounding error up to 5e-4 / rate_k).
    """
    path = Path(path)
    text = _text(path)
    drafts = draft_tokens = accepted = 0.0
    per_pos: np.ndarray | None = None
    lines = 0
    old_format = bool(_SPEC_LOG_V0.search(text))
    for line_no, line in enumerate(text.splitlines(), 1):
        m = _SPEC_LOG.search(line)
        if not m:
            continue
        body = m["body"]
        acc = re.search(r"Accepted: (-?\d+) tokens", body)
        dra = re.search(r"Drafted: (-?\d+) tokens", body)
        pos = re.search(r"Per-position acceptance rate: ([0-9., ]+?)(?:, Avg|$)", body)
        if not (acc and dra):
            continue
        lines += 1
        if not pos:
            old_format = True
            continue
        try:
            rates = np.array([float(x) for x in pos.group(1).split(",") if x.strip()])
        except ValueError:
            raise CapacityError(f"{path} line {line_no}: per-position acceptance rates "
                                f"'{quote(pos.group(1).strip(), 80)}' are not comma-separated numbers; give the log "
                                f"as vLLM wrote it") from None
        if np.any(rates > 1) or len(rates) > MAX_SPEC_POSITIONS:
            raise CapacityError(f"{path} line {line_no}: per-position acceptance rates "
                                f"'{quote(pos.group(1).strip(), 80)}' must be at most {MAX_SPEC_POSITIONS} rates in "
                                f"[0, 1]; give the log as vLLM wrote it")
        d_tok = float(dra.group(1))
        if d_tok < 0 or float(acc.group(1)) < 0 or float(acc.group(1)) > d_tok:
            raise CapacityError(f"{path} line {line_no}: Accepted: {acc.group(1)}, Drafted: {dra.group(1)} tokens; "
                                f"counts are >= 0 and accepted <= drafted (give the log as vLLM wrote it)")
        if d_tok == 0 or len(rates) == 0:
            continue
        n_drafts = d_tok / len(rates)
        if per_pos is not None and len(per_pos) != len(rates):
            raise CapacityError(f"{path}: log lines with {len(per_pos)} and {len(rates)} draft positions (servers with "
                                f"different num_speculative_tokens in one log); split the log per server")
        per_pos = rates * n_drafts if per_pos is None else per_pos + rates * n_drafts
        drafts += n_drafts
        draft_tokens += d_tok
        accepted += float(acc.group(1))
    if per_pos is None:
        if old_format or lines:
            if lines and drafts == 0 and not old_format:
                raise CapacityError(f"{path}: every SpecDecoding line reports 0 drafted tokens; no speculation ran")
            raise CapacityError(f"{path}: the SpecDecoding log lines have no per-position acceptance rates (vLLM before "
                                f"0.8.5 or V0 engine); give a /metrics dump or a newer vLLM's log")
        raise CapacityError(f"{path}: no 'SpecDecoding metrics' lines in this log")
    return _check_record(AcceptanceRecord(str(path), drafts, draft_tokens, accepted, per_pos,
                                          note=f"{lines} log intervals; per-position counts from 3-decimal rates"))


def result_acceptance(res: dict[str, Any], where: str) -> AcceptanceRecord | None:
    """The spec_decode_* deltas `vllm bench serve` stores in a result (None when absent)."""
    if "spec_decode_num_drafts" not in res:
        return None
    drafts = parse_float(res["spec_decode_num_drafts"])
    rates = np.asarray(res.get("spec_decode_per_position_acceptance_rates") or [], dtype=float)
    return _check_record(AcceptanceRecord(where, drafts, parse_float(res.get("spec_decode_draft_tokens")),
                                          parse_float(res.get("spec_decode_accepted_tokens")), rates * drafts))


def pooled(records: list[AcceptanceRecord]) -> AcceptanceRecord:
    """Counts of several records with the same N added up (one profile from several runs)."""
    ns = {r.num_spec_tokens for r in records}
    if len(ns) != 1:
        raise CapacityError(f"acceptance records with different numbers of draft positions {sorted(ns)}; "
                            f"calibrate each num_speculative_tokens separately")
    return AcceptanceRecord(" + ".join(r.source for r in records), sum(r.num_drafts for r in records),
                            sum(r.num_draft_tokens for r in records), sum(r.num_accepted_tokens for r in records),
                            np.sum([r.accepted_per_pos for r in records], axis=0))


def acceptance_config(rec: AcceptanceRecord) -> dict[str, Any]:
    """A scenario's `speculative.acceptance` mapping for these counts (a chain with marginal rates)."""
    s = np.minimum.accumulate(np.clip(rec.marginal, 0.0, 1.0))   # counts noise cannot make S increase
    return {"model": "chain", "basis": "marginal", "rates": [round(float(x), 4) for x in s]}


# --------------------------------------------------------------------------------------------
# One entry point for calibrate / validate
# --------------------------------------------------------------------------------------------


@dataclass
class Measurements:
    serving: pd.DataFrame
    acceptance: list[AcceptanceRecord]
    spec_files: list[Path]
    formats: dict[str, str]


def load(files: list[str | Path], ov: Overrides | None = None) -> Measurements:
    """Read every file by its detected format."""
    ov = ov or Overrides()
    frames, acc, spec, formats = [], [], [], {}
    for f in files:
        path = Path(f)
        kind = detect_format(path)
        formats[str(path)] = kind
        if kind == "vllm_result":
            df = read_vllm_results(path, ov)
            frames.append(df)
            for i, o in enumerate(_json_objects(_text(path)) or []):
                rec = result_acceptance(o, f"{path}" + (f" (result {i + 1})" if i else ""))
                if rec is not None:
                    acc.append(rec)
        elif kind == "prometheus":
            acc.append(read_prometheus(path))
        elif kind == "vllm_log":
            acc.append(read_spec_log(path))
        elif kind == "spec_csv":
            spec.append(path)
        else:
            df = read_measurements(path)
            if ov.gpu and "gpu" in df and (df["gpu"] == "").all():
                df["gpu"] = ov.gpu
            frames.append(df)
    serving = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return Measurements(serving, acc, spec, formats)
