"""JSON as the project writes it: NaN and infinity become null (they are not JSON), numpy scalars and
arrays become numbers and lists, paths become strings. One copy for the CLI's `--json` output and
every result file (result.json, plan.json, spec_summary.json)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any


def _numpy():
    """numpy if something has imported it, else None: no numpy object can exist before numpy is
    imported, so the CLI's start-up (`capacity --help`, `capacity hardware`) need not pay for it."""
    return sys.modules.get("numpy")


def clean(obj: Any) -> Any:
    """`obj` with numpy scalars as Python numbers and every non-finite float replaced by None,
    containers walked."""
    np = _numpy()
    if np is not None and isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {(k if isinstance(k, (str, int, float, bool)) or k is None else str(k)): clean(v)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def default(o: Any) -> Any:
    """`json.dumps(default=...)` for the types `clean` leaves: paths, numpy booleans, integers and arrays."""
    if isinstance(o, Path):
        return str(o)
    np = _numpy()
    if np is not None:
        if isinstance(o, np.bool_):
            return bool(o)
        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return None if np.isnan(o) else float(o)
        if isinstance(o, np.ndarray):
            return clean(o.tolist())
    raise TypeError(f"not JSON serialisable: {type(o)}")


def dumps(obj: Any, indent: int | None = 2) -> str:
    """Strict JSON text of `obj` (never NaN or Infinity)."""
    return json.dumps(clean(obj), indent=indent, default=default, allow_nan=False)


def print_json(obj: Any) -> None:
    print(dumps(obj))


def write_json(path: Path, obj: Any) -> None:
    Path(path).write_text(dumps(obj))
