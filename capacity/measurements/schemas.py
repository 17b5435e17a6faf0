"""The measurement vocabulary: the CSV schemas, their cell parsers and the names rows use.

Two CSV schemas (capacity/data/measurements/README.md):

* serving measurements (as `serving_vllm.csv`): SERVING_REQUIRED columns, read by `read_measurements`;
  PREDICTED are the measured columns the simulator predicts, REPORTED the ROCm blogs' value of
  unstated basis;
* speculative speedups (as `seed_spec_decode.csv`): SPEC_REQUIRED columns (OPTIONAL_ENGINE kept when
  given), read by `read_spec_measurements`, recognised by `is_spec_file`.

Cells: `parse_float` (any numeric cell), `marginal_rates` (per_position_acceptance), `method_name`
(a speedup row's method label), `serving_method` / `serving_draft` (a serving row's spec_method),
`draft_checkpoint` (a speedup row's draft), and three precision rules: `serving_precision` (the
whole cell names the format), `spec_precision` (its first word does) and `blog_precision` (the
first format named anywhere in the ROCm blogs' free text). Method labels resolve through
methods.yaml (`capacity.spec.methods.find_method`); model names through model_aliases.yaml.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from capacity.errors import CapacityError
from capacity.paths import data_dir
from capacity.spec.methods import find_method
from capacity.util.text import quote

SERVING_REQUIRED = ("gpu", "model", "framework", "tp", "isl", "osl", "concurrency_or_qps", "load_type")
# The measured serving columns the simulator predicts (each gets a `predicted_<column>`).
PREDICTED = ("output_tok_s_per_gpu", "total_tok_s_per_gpu", "tok_s_per_user", "ttft_ms", "tpot_ms", "e2e_ms")
# The ROCm blogs' value of unstated basis (tok/s/GPU) is compared as output tok/s per GPU.
REPORTED = "reported_value"

SPEC_REQUIRED = ("target", "method", "draft_checkpoint", "gpu", "tp", "precision", "dataset",
                 "num_speculative_tokens", "per_position_acceptance", "mean_accepted_length",
                 "baseline_output_tok_s", "output_tok_s", "speedup", "source")
OPTIONAL_ENGINE = ("max_num_batched_tokens", "max_model_len")

# A precision label of the measurement files -> the load_model precision it means.
PRECISIONS = {"fp16": "bf16", "bf16": "bf16", "fp8": "fp8", "int4": "int4", "fp4": "mxfp4", "mxfp4": "mxfp4",
              "mxfp8": "mxfp8", "nvfp4": "fp4"}
# A cell that starts like a precision label (fp88, bf61, int3) but is none of PRECISIONS is a typo.
_PRECISION_LIKE = re.compile(r"^(fp|bf|int|mxfp|nvfp|mxint|uint)\d+$")

LABEL_COLUMNS = ("gpu", "model", "framework", "precision", "load_type", "spec_method", "latency_stat")
MAX_TP = 64                 # as the scenario's deployment.tensor_parallel_size
MAX_GPUS = 4096             # GPUs of one measured deployment
MAX_TOKENS = 10_000_000     # prompt or output length of one request
MAX_PROMPTS = 10_000_000    # requests of one benchmark run
MAX_NAME_BYTES = 255        # a GPU or model name (one path component)


def default_serving_file() -> Path:
    """The shipped serving rows (the serving and the speculative serving checks' default)."""
    return data_dir() / "measurements" / "serving_vllm.csv"


@lru_cache(maxsize=1)
def model_aliases() -> dict[str, str]:
    """model_aliases.yaml: a measurement's model name -> the shipped config's name."""
    return yaml.safe_load((data_dir() / "measurements" / "model_aliases.yaml").read_text()) or {}


# --------------------------------------------------------------------------------------------------
# Cells
# --------------------------------------------------------------------------------------------------

def parse_float(v: Any) -> float:
    """A cell as a float ("inf" and "infinity" in any case are infinite, as float reads them); NaN when
    it is not a number."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def marginal_rates(value: Any) -> list[float]:
    """The per_position_acceptance cell as a list of floats ([] when empty)."""
    text = str(value if value is not None else "").replace(",", " ").replace(";", " ").split()
    try:
        return [float(x) for x in text]
    except ValueError:
        raise CapacityError(f"per_position_acceptance '{quote(value)}' is not a space-separated list of numbers") from None


def method_name(label: Any) -> str:
    """The methods.yaml name of a CSV's method label ("EAGLE-3" -> eagle3)."""
    m = find_method(label)
    if m is None:
        raise CapacityError(f"unknown method label '{label}'; use one of: Native MTP, Gemma 4 MTP, EAGLE-3, DFlash, "
                            f"DSpark (or a methods.yaml name)")
    return m.name


def serving_method(spec_method: str) -> str | None:
    """The methods.yaml name of a serving row's spec_method cell (its first word; 'draft model ...' ->
    draft_model); None for no speculation. An unknown first word is kept as it is."""
    text = spec_method.strip().lower()
    if not text or text == "none":
        return None
    if text.startswith("draft model"):
        return "draft_model"
    return getattr(find_method(text.split()[0]), "name", text.split()[0])


def serving_draft(spec_method: str) -> tuple[str | None, str | None]:
    """(draft id, note) from a spec_method cell such as 'eagle3 (BF16 draft lightseekorg/kimi-k2.5-eagle3)'."""
    m = re.search(r"draft ([\w.-]+/[\w.-]+)", spec_method)
    if m:
        return m.group(1), None
    m = re.search(r"draft model ([\w.-]+)", spec_method)
    if m:
        return m.group(1), None
    return None, None


def draft_checkpoint(row: dict[str, Any]) -> str | None:
    """A speedup row's draft checkpoint when it names one ("(built-in MTP module)" -> None)."""
    d = str(row.get("draft_checkpoint", "") or "").strip()
    if not d or d.startswith("(") or d.lower() in ("none", "built-in", "nan"):
        return None
    return d


def serving_precision(value: Any) -> str | None:
    """A serving row's precision cell, the whole cell a label of PRECISIONS (None otherwise)."""
    return PRECISIONS.get(str(value).strip().lower())


def spec_precision(value: Any) -> str | None:
    """A speedup row's precision cell: its first word mapped to a load_model precision; 'checkpoint
    native' -> None."""
    text = str(value or "").strip().lower()
    if not text or "checkpoint native" in text:
        return None
    return PRECISIONS.get(text.split()[0])


def blog_precision(text: Any, model: Any = "") -> str | None:
    """A ROCm blog row's precision cell (free text): the first of mxfp4, mxfp8, fp8, int4, bf16 it
    names; None when it names none or hedges with '?'. MXFP4 of AMD Quark (the cell says Quark, or the model
    cell names an amd/...MXFP4 checkpoint) quantizes the activations too, mxfp4_w4a4: "all-4-bit MXFP4"
    (https://rocm.blogs.amd.com/artificial-intelligence/w4a6-quant-mm/README.html, of its Quark Qwen3.6-27B and
    Llama-3.1-8B checkpoints), as the model cards of amd/Kimi-K2.5-MXFP4 and amd/MiniMax-M2.5-MXFP4 say
    (serve_recipes.yaml)."""
    t = str(text).lower()
    if "mxfp4" in t and "?" not in t and ("quark" in t or re.search(r"\bamd/\S*mxfp4", str(model).lower())):
        return "mxfp4_w4a4"
    for key in ("mxfp4", "mxfp8", "fp8", "int4", "bf16"):
        if key in t and "?" not in t:
            return PRECISIONS[key]
    return None


# --------------------------------------------------------------------------------------------------
# Row checks: a measured value is checked once, where it enters (a CSV cell or a vLLM result key)
# --------------------------------------------------------------------------------------------------

def bad_value(where: str, key: str, value: Any, want: str) -> CapacityError:
    """The one-line error for a cell or key whose value makes no sense."""
    shown = "null" if value is None else quote(value)
    return CapacityError(f"{where}: {key} is {shown}; {want}")


def check_number(where: str, key: str, value: Any, *, low: float = 0.0, high: float = math.inf,
                 low_open: bool = False, whole: bool = False, allow_inf: bool = False) -> float:
    """`value` as a float in [low, high] (or (low, high] with `low_open`), finite unless `allow_inf`,
    integral with `whole`; anything else is a one-line error naming `key`."""
    if isinstance(value, bool):
        raise bad_value(where, key, value, "give a number")
    x = parse_float(value)
    kind = "a whole number" if whole else "a number"
    rng = f"{'>' if low_open else '>='} {low:g}" + (f" and <= {high:g}" if math.isfinite(high) else "")
    if math.isnan(x) or (math.isinf(x) and not (allow_inf and x > 0)):
        raise bad_value(where, key, value, f"give {kind} {rng}")
    if math.isinf(x):
        return x
    if (x <= low if low_open else x < low) or x > high or (whole and x != int(x)):
        raise bad_value(where, key, value, f"give {kind} {rng}")
    return x


def check_name(where: str, key: str, value: Any) -> None:
    """A GPU or model name short enough to be looked up as a file name."""
    text = str(value)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES or any(ord(c) < 32 for c in text):
        raise bad_value(where, key, value, f"give a name of at most {MAX_NAME_BYTES} bytes without control characters "
                                           f"(a Hugging Face id or a shipped name)")


def check_precision(where: str, value: Any) -> None:
    """A precision cell that looks like a format label but is not one (fp88) is a typo, not 'unstated'."""
    text = str(value or "").strip().lower()
    first = re.split(r"[\s?(,;]", text, maxsplit=1)[0] if text else ""
    if _PRECISION_LIKE.match(first) and first not in PRECISIONS:
        raise bad_value(where, "precision", value, f"use one of {', '.join(PRECISIONS)} (or leave it empty for the "
                                                   f"checkpoint's own)")


def _present(value: Any) -> bool:
    return value is not None and str(value).strip() not in ("", "nan", "NaN", "None", "null")


def check_serving_row(row: dict[str, Any], where: str) -> None:
    """The cells of one serving row the simulator uses: TP a whole number in 1..64 that divides the GPUs,
    GPUs, lengths and load positive and finite, a known precision label, names a file system can look up.
    Empty cells stay 'not stated' (the row is then skipped with its reason)."""
    for key in ("gpu", "model"):
        if row.get(key) not in (None, ""):
            check_name(where, key, row[key])
    if _present(row.get("precision")):
        check_precision(where, row["precision"])
    tp = check_number(where, "tp", row["tp"], low=1, high=MAX_TP, whole=True) if _present(row.get("tp")) else None
    if _present(row.get("num_gpus")):
        gpus = check_number(where, "num_gpus", row["num_gpus"], low=1, high=MAX_GPUS, whole=True)
        ep = parse_float(row.get("ep"))
        if tp is not None and gpus % tp and not (ep > 1 and gpus == tp * ep):
            raise CapacityError(f"{where}: num_gpus {gpus:g} is not a multiple of tp {tp:g}; give the GPUs of whole "
                                f"replicas (num_gpus = replicas x tp)")
    for key in ("isl", "osl"):
        if _present(row.get(key)):
            check_number(where, key, row[key], low=0, low_open=True, high=MAX_TOKENS)
    load = parse_float(row.get("concurrency_or_qps"))
    if _present(row.get("concurrency_or_qps")) and not math.isnan(load):    # text such as "1000 (offline)": not stated
        closed = any(w in str(row.get("load_type", "")).lower() for w in ("closed", "concurrency"))
        check_number(where, "concurrency_or_qps", row["concurrency_or_qps"], low=0, low_open=True,
                     high=MAX_PROMPTS, whole=closed, allow_inf=not closed)
    if _present(row.get("num_prompts")) and not math.isnan(parse_float(row.get("num_prompts"))):
        check_number(where, "num_prompts", row["num_prompts"], low=1, high=MAX_PROMPTS, whole=True)
    for key in ("max_num_batched_tokens", "max_num_seqs"):
        if _present(row.get(key)) and not math.isnan(parse_float(row.get(key))):
            check_number(where, key, row[key], low=1, high=MAX_TOKENS, whole=True)


def check_spec_row(row: dict[str, Any], where: str) -> None:
    """A speculative-speedup row's numbers: TP and N whole (1..64), N marginal rates in [0, 1], the mean
    accepted length in [1, N + 1], throughputs and speedup positive; names a file system can look up."""
    for key in ("gpu", "target"):
        check_name(where, key, row.get(key, ""))
    check_precision(where, row.get("precision"))
    check_number(where, "tp", row.get("tp"), low=1, high=MAX_TP, whole=True)
    n = check_number(where, "num_speculative_tokens", row.get("num_speculative_tokens"), low=1, high=64, whole=True)
    try:
        rates = marginal_rates(row.get("per_position_acceptance"))
    except CapacityError as e:
        raise CapacityError(f"{where}: {e}") from None
    if len(rates) < n or any(not (0 <= r <= 1) for r in rates):
        raise bad_value(where, "per_position_acceptance", row.get("per_position_acceptance"),
                        f"give {n:g} rates in [0, 1] separated by spaces (P(accepted >= k), k = 1..N)")
    if _present(row.get("mean_accepted_length")):
        check_number(where, "mean_accepted_length", row["mean_accepted_length"], low=1, high=n + 1)
    for key in ("baseline_output_tok_s", "output_tok_s", "speedup"):
        if _present(row.get(key)):
            check_number(where, key, row[key], low=0, low_open=True)
    for key in OPTIONAL_ENGINE:
        if _present(row.get(key)):
            check_number(where, key, row[key], low=1, high=MAX_TOKENS, whole=True)


def _is_modelled_kind(row: dict[str, Any]) -> bool:
    """Rows of a kind the simulator models at all (vLLM, not disaggregated, no DP attention): their cells are checked."""
    flag = lambda v: str(v).strip().lower() in ("true", "yes", "1")   # noqa: E731
    return "vllm" in str(row.get("framework", "")).lower() and not flag(row.get("disagg")) \
        and not flag(row.get("dp_attention"))


# --------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------

def read_csv_checked(path: Path, required: tuple[str, ...] | list[str], kind: str) -> pd.DataFrame:
    """A measurement CSV as strings; a missing file, broken CSV or missing column is one line."""
    path = Path(path)
    if not path.is_file():
        raise CapacityError(f"measurement file {path} not found")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except Exception as e:  # pandas raises several types for a broken CSV
        raise CapacityError(f"{path}: not a readable CSV ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise CapacityError(f"{path}: not a {kind} file, missing columns {', '.join(missing)} "
                            f"(schema: see capacity/data/measurements/README.md)")
    return df


def read_measurements(path: Path) -> pd.DataFrame:
    """A serving-measurement file as strings, with its `file` name and `row` number in front."""
    df = read_csv_checked(path, SERVING_REQUIRED, "serving measurement")
    for i, row in enumerate(df.to_dict("records")):
        for key in LABEL_COLUMNS:      # printed in skip reasons and tables: one line each
            if any(ord(c) < 32 for c in str(row.get(key, ""))):
                raise bad_value(f"{path} row {i + 1}", key, row[key], "give it on one line without control characters")
        if _is_modelled_kind(row):
            check_serving_row(row, f"{path} row {i + 1}")
    df.insert(0, "file", Path(path).name)
    df.insert(1, "row", np.arange(len(df)))
    return df


def is_spec_file(path: str | Path) -> bool:
    """True when the CSV's header has every column of the speculative-speedup schema."""
    try:
        header = pd.read_csv(path, nrows=0).columns
    except Exception:  # unreadable files are reported by the reader that gets them
        return False
    return all(c in header for c in SPEC_REQUIRED)


def read_spec_measurements(path: str | Path) -> pd.DataFrame:
    """A speculative-speedup file as a DataFrame (SPEC_REQUIRED columns; extra columns kept).

    Numeric columns are parsed; `per_position_acceptance` stays a space-separated string of marginal
    rates P(A >= k). Raises CapacityError naming the file and the missing columns."""
    path = Path(path)
    df = read_csv_checked(path, SPEC_REQUIRED, "speculative-speedup")
    for i, row in enumerate(df.to_dict("records")):
        check_spec_row(row, f"{path} row {i + 1}")
    for c in ("tp", "num_speculative_tokens", "mean_accepted_length", "baseline_output_tok_s", "output_tok_s",
              "speedup") + OPTIONAL_ENGINE:
        if c in df.columns:
            df[c] = pd.to_numeric(df[c].replace("", np.nan), errors="coerce")
    df.insert(0, "file", path.name)
    df.insert(1, "row", np.arange(len(df)))
    return df
