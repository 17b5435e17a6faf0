"""util.jsonio: the one JSON writer. JSON (RFC 8259) has no NaN or Infinity, so they are written as
null; numpy scalars and arrays are written as the numbers they hold."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from capacity.util import jsonio


def test_non_finite_numbers_become_null_and_numpy_values_plain_numbers():
    obj = {"nan": math.nan, "inf": -math.inf, "np_nan": np.float64("nan"), "i": np.int64(3), "b": np.bool_(True),
           "f": np.float32(0.5), "arr": np.array([1.0, np.nan, np.inf]), "path": Path("a/b"), "t": (1, 2.5),
           np.int64(7): "numpy key"}
    text = jsonio.dumps(obj)
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"nan": None, "inf": None, "np_nan": None, "i": 3, "b": True, "f": 0.5,
                                "arr": [1.0, None, None], "path": "a/b", "t": [1, 2.5], "7": "numpy key"}


def test_unknown_types_are_refused():
    with pytest.raises(TypeError, match="not JSON serialisable"):
        jsonio.dumps({"x": object()})
