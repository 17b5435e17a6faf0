"""What a cold start imports (issue 20): pandas only where a trace is read or a DataFrame built.

(A default simulation imports no scipy: tests/test_acceptance.py::test_a_simulation_imports_no_scipy.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _fresh_python(code: str) -> list[str]:
    """The lines `code` prints in a fresh interpreter (nothing imported before it)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split("\n")


def test_loading_a_scenario_and_drawing_synthetic_traffic_import_no_pandas() -> None:
    code = ("import sys\nimport numpy as np\nfrom capacity.inputs import scenario, traffic\n"
            "sc = scenario.load('chatbot_single_turn', ['traffic.classes=[{name: a, input_tokens: {dist: fixed, value: 100}, "
            "output_tokens: {dist: lognormal, median: 50, sigma: 0.5}}]'])\n"
            "stream = traffic.build_requests(sc.traffic, np.random.default_rng(0))\n"
            "assert len(stream) == sc.traffic.num_requests\n"
            "print('pandas' in sys.modules)")
    assert _fresh_python(code) == ["False"]


def test_the_default_simulation_and_its_summary_import_no_pandas() -> None:
    """`capacity simulate` on the default scenario: the metrics are computed on numpy columns
    (metrics.Columns); pandas comes in only when someone asks for the `requests` DataFrame."""
    code = ("import sys, io, contextlib\nfrom capacity.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['simulate', '--json'])\n"
            "print('pandas' in sys.modules)\n"
            "from capacity.inputs import scenario\nfrom capacity.sim import simulate\n"
            "res = simulate.run(scenario.load(None, ['traffic.arrival.num_sessions=20']))\n"
            "df = res.requests\n"
            "print('pandas' in sys.modules, list(df.columns) == res.request_columns.names, len(df) == len(res.request_columns))")
    assert _fresh_python(code) == ["False", "True True True"]
