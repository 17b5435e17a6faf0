"""The notebook API (capacity/api.py): the README's example runs, and the API returns what the CLI prints."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import capacity
from capacity.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_example_runs():
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## From a notebook"):text.index("## A scenario")]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md (From a notebook)", "exec"), namespace)   # noqa: S102 - our own README
    assert namespace["plan"].recommendation["replicas"] >= 1
    assert len(namespace["slow"]) == 3


def test_simulate_returns_what_the_cli_prints(capsys):
    sim = capacity.simulate(traffic__num_requests=60, set={"traffic.arrival.rate_sessions_per_s": 0.75})
    assert main(["simulate", "--json", "--set", "traffic.num_requests=60", "--set", "traffic.arrival.rate_sessions_per_s=0.75"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert sim.metrics["completed"] == cli["metrics"]["completed"] == 60
    assert sim.metrics["ttft_ms"] == cli["metrics"]["ttft_ms"]
    row = sim.metrics_frame().iloc[0]
    assert row["ttft_ms_p99"] == cli["metrics"]["ttft_ms"]["p99"]
    assert list(sim.comparison().columns) == ["gemma4_mtp N=3", "no speculation"]
    assert sim.comparison().loc["completed", "no speculation"] == cli["without_speculation"]["metrics"]["completed"]
    assert {"ttft_ms", "tpot_ms", "e2e_ms"} <= set(sim.requests.columns) and len(sim.requests) == 60


def test_api_errors_are_the_clis_one_line_errors():
    from capacity.errors import CapacityError

    with pytest.raises(CapacityError, match="unknown GPU"):
        capacity.simulate(deployment__gpu="A100")
