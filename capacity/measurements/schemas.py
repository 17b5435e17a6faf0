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
        raise CapacityError(f"per_position_acceptance '{value}' is not a space-separated list of numbers") from None


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


def blog_precision(text: Any) -> str | None:
    """A ROCm blog row's precision cell (free text): the first of mxfp4, mxfp8, fp8, int4, bf16 it
    names; None when it names none or hedges with '?'."""
    t = str(text).lower()
    for key in ("mxfp4", "mxfp8", "fp8", "int4", "bf16"):
        if key in t and "?" not in t:
            return PRECISIONS[key]
    return None


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
    for c in ("tp", "num_speculative_tokens", "mean_accepted_length", "baseline_output_tok_s", "output_tok_s",
              "speedup") + OPTIONAL_ENGINE:
        if c in df.columns:
            df[c] = pd.to_numeric(df[c].replace("", np.nan), errors="coerce")
    df.insert(0, "file", path.name)
    df.insert(1, "row", np.arange(len(df)))
    return df
