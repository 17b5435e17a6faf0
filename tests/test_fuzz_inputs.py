"""Fuzzing every shipped input kind at its parse boundary (issue 19).

Each test mutates one kind of input a user hands the CLI - a scenario file, a `--set` value, a serving
CSV, a speculative-speedup CSV, a `vllm bench serve` result JSON, a `/metrics` dump, a server log, a
trace CSV, a sweep grid - and runs the code that reads it as far as the parsed, validated value (the
scenario, the rows as scenarios, the acceptance record, the request stream, the grid points); the
simulation itself is not run. The property: a `CapacityError` whose message is one line of bounded
length (what `capacity.cli.main` prints, exit status 2), or a result that makes sense (counts whole
and positive, rates in [0, 1], ...) - never another exception, and never longer than a few seconds
(an alarm turns a hang into a failure).

CI runs a fixed, derandomized set of 3,050 examples (about 25 s on a shared 2-core machine);
`CAPACITY_FUZZ_EXAMPLES=10` runs ten times as many (the examples of each test are multiplied).
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capacity.errors import CapacityError
from capacity.inputs import scenario as scenario_mod
from capacity.inputs.traffic import build_requests
from capacity.measurements import readers
from capacity.measurements.row_scenario import row_scenario, speculative_config
from capacity.measurements.schemas import default_serving_file, read_spec_measurements
from capacity.paths import data_dir
from capacity.studies import sweep as sweep_mod

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data" / "vllm"
SCALE = float(os.environ.get("CAPACITY_FUZZ_EXAMPLES", "1"))
HANG_S = 5.0


def fuzz(n: int):
    """Hypothesis settings for `n` CI examples (times CAPACITY_FUZZ_EXAMPLES), reproducible run to run."""
    return settings(max_examples=max(1, int(n * SCALE)), deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=True)


class Hang(Exception):
    pass


@contextmanager
def no_hang(seconds: float = HANG_S):
    def alarm(signum, frame):
        raise Hang(f"no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def outcome(fn, *args):
    """fn(*args) or the CapacityError it raised; the error must be what the CLI prints as one line."""
    with no_hang():
        try:
            return fn(*args)
        except CapacityError as e:
            msg = str(e)
            assert msg and "\n" not in msg and "\r" not in msg, repr(msg[:300])
            assert len(msg) <= 600, f"{len(msg)} characters: {msg[:300]}"
            return e


# ------------------------------------------------------------------------- adversarial values
NASTY_TEXT = ["", " ", "0", "-1", "1e9", "1e308", "-0", "nan", "NaN", "inf", "-inf", ".inf", "Infinity", "2.5",
              "0.5.5", "null", "~", "true", "x", "[", "{", "]", "'", '"', "&a", "*a", "!!python/name:os.system",
              "!!binary AAAA", "a" * 300, "9" * 40, "\x00", "\xff", "é", "\u202e", "1,5", "0x10", "1_000"]
NASTY_NUMBERS = [0, -1, 1, 2, 2.5, -2.5, 1e9, 10**30, -(10**30), 1e-300, float("inf"), float("-inf"), float("nan"),
                 True, False, None, 2**63, 0.1]
nasty_scalar = st.one_of(st.sampled_from(NASTY_TEXT), st.sampled_from(NASTY_NUMBERS),
                         st.text(max_size=20), st.integers(-10**12, 10**12),
                         st.floats(allow_nan=True, allow_infinity=True))
nasty_json = st.one_of(nasty_scalar, st.lists(nasty_scalar, max_size=4),
                       st.dictionaries(st.text(max_size=5), nasty_scalar, max_size=3))


def text_mutation(text: str):
    """A strategy: `text` with a few characters inserted, deleted or replaced, or a line repeated / dropped."""
    @st.composite
    def mutate(draw):
        t = text
        for _ in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from(["insert", "delete", "replace", "dup_line", "drop_line", "token"]))
            i = draw(st.integers(0, max(0, len(t) - 1)))
            if kind == "insert":
                t = t[:i] + draw(st.sampled_from(list(":-[]{}&*!#'\"\n\t ,.0123456789e") + ["\xff", "é"])) + t[i:]
            elif kind == "delete":
                t = t[:i] + t[i + draw(st.integers(1, 8)):]
            elif kind == "replace":
                t = t[:i] + draw(st.sampled_from(NASTY_TEXT)) + t[i + draw(st.integers(0, 6)):]
            else:
                lines = t.split("\n")
                j = draw(st.integers(0, len(lines) - 1))
                if kind == "dup_line":
                    lines.insert(j, lines[j])
                elif kind == "drop_line":
                    lines.pop(j)
                else:           # a number in the line swapped for a nasty value
                    import re
                    nums = list(re.finditer(r"-?\d+(\.\d+)?", lines[j]))
                    if nums:
                        m = nums[draw(st.integers(0, len(nums) - 1))]
                        lines[j] = lines[j][:m.start()] + draw(st.sampled_from(NASTY_TEXT)) + lines[j][m.end():]
                t = "\n".join(lines)
        return t
    return mutate()


def write(tmp_dir: Path, name: str, content: str | bytes) -> Path:
    path = tmp_dir / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_bytes(content.encode("utf-8", "surrogatepass"))
    return path


@pytest.fixture(scope="module")
def tmp_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


# ------------------------------------------------------------------------- what a valid result is
def check_scenario(sc) -> None:
    d = sc.deployment
    assert isinstance(d.tensor_parallel_size, int) and 1 <= d.tensor_parallel_size <= 64
    assert isinstance(d.replicas, int) and d.replicas >= 1
    assert 0 <= sc.speculative.num_speculative_tokens <= 64
    assert sc.simulation.seed >= 0
    assert len(sc.model_dump_json()) < 5_000_000        # nothing expanded beyond the bounds


def check_scenario_dict(data) -> None:
    """A row's scenario dict validates, or is refused with one line."""
    res = outcome(scenario_mod.from_dict, data, "row")
    if not isinstance(res, CapacityError):
        check_scenario(res)


def check_serving(meas) -> None:
    for row in meas.serving.to_dict("records"):
        scen, reason = outcome(row_scenario, row)
        if scen is None:
            assert isinstance(reason, str) and "\n" not in reason
            continue
        dep = scen["deployment"]
        assert isinstance(dep["tensor_parallel_size"], int) and 1 <= dep["tensor_parallel_size"] <= 64
        assert 1 <= dep["replicas"] <= 4096
        check_scenario_dict(scen)


def check_acceptance(meas) -> None:
    for rec in meas.acceptance:
        s = rec.marginal
        assert np.all(np.isfinite(s)) and np.all(s >= 0) and np.all(s <= 1 + 1e-6), s
        assert 0 <= rec.num_accepted_tokens <= rec.num_draft_tokens * (1 + 1e-6)
        assert 1 <= rec.mean_acceptance_length <= 1 + rec.num_spec_tokens + 1e-6
        cfg = readers.acceptance_config(rec)
        assert all(0 <= r <= 1 for r in cfg["rates"])


def read_measurement(path: Path):
    res = outcome(readers.load, [path])
    if isinstance(res, CapacityError):
        return res
    check_serving(res)
    check_acceptance(res)
    return res


# ------------------------------------------------------------------------- 1. scenario files
DEFAULT = (ROOT / "scenarios" / "default.yaml").read_text()


@fuzz(400)
@given(text=text_mutation(DEFAULT))
def test_fuzz_scenario_file(tmp_dir, text):
    res = outcome(scenario_mod.load, str(write(tmp_dir, "scenario.yaml", text)))
    if not isinstance(res, CapacityError):
        check_scenario(res)


# ------------------------------------------------------------------------- 2. --set values
def _dotted_keys(data, prefix=""):
    out = []
    for k, v in data.items():
        key = f"{prefix}{k}"
        out.append(key)
        if isinstance(v, dict):
            out += _dotted_keys(v, key + ".")
    return out


SET_KEYS = _dotted_keys(yaml.safe_load(DEFAULT)) + [
    "speculative.method", "speculative.num_speculative_tokens", "speculative.policy", "speculative.acceptance",
    "speculative.overrides", "simulation.seed", "simulation.max_sim_time_s", "deployment.gpu_overrides",
    "plan.target_rate_rps", "engine.block_size", "nope", "deployment.nope", ".", "a..b"]
set_value = st.one_of(st.sampled_from(NASTY_TEXT), st.text(max_size=30),
                      st.sampled_from(["{kind: goodput, max_n: 1000000000}", "[1, 2", "{a: &x [1], b: *x}",
                                       "&a [*a]", "[" * 80 + "]" * 80, "{dist: fixed, value: -3}", "{}", "[]"]))


@fuzz(500)
@given(sets=st.lists(st.tuples(st.sampled_from(SET_KEYS), set_value), min_size=1, max_size=3))
def test_fuzz_set_values(sets):
    res = outcome(scenario_mod.load, None, [f"{k}={v}" for k, v in sets])
    if not isinstance(res, CapacityError):
        check_scenario(res)


# ------------------------------------------------------------------------- 3. serving CSV
with default_serving_file().open() as _f:
    _ROWS = list(csv.DictReader(_f))
SERVING_HEADER = list(_ROWS[0].keys())
SERVING_ROWS = [r for r in _ROWS if r["tp"] in ("1.0", "2.0") and r["gpu"] in ("MI300X", "MI355X")
                and r["framework"].lower().startswith("vllm") and r["isl"] and "closed" in r["load_type"]][:20]
SERVING_COLUMNS = ["gpu", "num_gpus", "model", "precision", "framework", "tp", "isl", "osl", "concurrency_or_qps",
                   "load_type", "spec_method", "ep", "num_prompts", "ttft_ms", "tpot_ms", "output_tok_s_per_gpu",
                   "disagg", "max_num_seqs"]


@fuzz(350)
@given(base=st.sampled_from(SERVING_ROWS),
       changes=st.dictionaries(st.sampled_from(SERVING_COLUMNS), st.sampled_from(NASTY_TEXT) | st.text(max_size=12),
                               min_size=1, max_size=3))
def test_fuzz_serving_csv(tmp_dir, base, changes):
    buf = io.StringIO()
    w = csv.DictWriter(buf, SERVING_HEADER + [c for c in changes if c not in SERVING_HEADER])
    w.writeheader()
    w.writerow({**base, **changes})
    read_measurement(write(tmp_dir, "serving.csv", buf.getvalue()))


# ------------------------------------------------------------------------- 4. speculative-speedup CSV
SPEC_TEXT = (data_dir() / "measurements" / "seed_spec_decode.csv").read_text()
SPEC_LINES = SPEC_TEXT.splitlines()
SPEC_SMALL = "\n".join(SPEC_LINES[:4]) + "\n"


def read_spec(path: Path):
    df = outcome(read_spec_measurements, path)
    if isinstance(df, CapacityError):
        return
    for row in df.to_dict("records"):
        cfg = outcome(speculative_config, row)
        if isinstance(cfg, CapacityError):
            continue
        assert 1 <= cfg["num_speculative_tokens"] <= 10**6
        scen = {"deployment": {"model": "google/gemma-4-31B-it"}, "traffic": {"num_requests": 1, "classes": [
            {"name": "a", "input_tokens": {"dist": "fixed", "value": 8}, "output_tokens": {"dist": "fixed", "value": 8}}]},
            "speculative": cfg}
        check_scenario_dict(scen)


@fuzz(250)
@given(text=text_mutation(SPEC_SMALL))
def test_fuzz_spec_csv(tmp_dir, text):
    read_spec(write(tmp_dir, "spec.csv", text))


# ------------------------------------------------------------------------- 5. vllm bench serve result JSON
RESULT = json.loads((DATA / "bench_serve_result_nodetail.json").read_text())
RESULT.update({"tensor_parallel_size": 1, "gpu": "MI300X"})
DETAILED = json.loads((DATA / "bench_serve_result_detailed.json").read_text())
DETAILED.update({"tensor_parallel_size": 1, "gpu": "MI300X"})
RESULT_KEYS = sorted(set(RESULT) | set(DETAILED) | {"failed", "num_prompts", "max_concurrency", "replicas",
                                                    "spec_decode_num_drafts", "input_len"})


@fuzz(400)
@given(base=st.sampled_from([RESULT, DETAILED]),
       changes=st.dictionaries(st.sampled_from(RESULT_KEYS), nasty_json, min_size=1, max_size=3),
       drop=st.lists(st.sampled_from(RESULT_KEYS), max_size=2))
def test_fuzz_vllm_result(tmp_dir, base, changes, drop):
    res = {k: v for k, v in {**base, **changes}.items() if k not in drop}
    read_measurement(write(tmp_dir, "result.json", json.dumps(res)))


# ------------------------------------------------------------------------- 6. /metrics text
PROM = "\n".join([
    "# TYPE vllm:spec_decode_num_drafts counter",
    'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100',
    "# TYPE vllm:spec_decode_num_draft_tokens counter",
    'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300',
    "# TYPE vllm:spec_decode_num_accepted_tokens counter",
    'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 150',
    "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 80',
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 50',
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 20', ""])


@fuzz(350)
@given(text=text_mutation(PROM))
def test_fuzz_prometheus(tmp_dir, text):
    read_measurement(write(tmp_dir, "metrics.prom", text))


# ------------------------------------------------------------------------- 7. server log
LOG = "\n".join((DATA / "specdecode_club3090_vllm0.20.1.log").read_text().splitlines()[:8]) + "\n"


@fuzz(300)
@given(text=text_mutation(LOG))
def test_fuzz_server_log(tmp_dir, text):
    read_measurement(write(tmp_dir, "server.log", text))


# ------------------------------------------------------------------------- 8. trace CSV
TRACE = "arrival_s,input_tokens,output_tokens\n0.0,100,20\n0.5,2000,64\n1.25,30,1\n2.0,512,128\n"


@fuzz(250)
@given(text=text_mutation(TRACE))
def test_fuzz_trace_csv(tmp_dir, text):
    path = write(tmp_dir, "trace.csv", text)
    sets = [f"traffic.arrival={{process: trace, path: '{path}'}}", "traffic.num_requests=4"]
    sc = outcome(scenario_mod.load, None, sets)
    if isinstance(sc, CapacityError):
        return
    stream = outcome(build_requests, sc.traffic, np.random.default_rng(0))
    if isinstance(stream, CapacityError):
        return
    assert np.all(stream.prompt_tokens >= 1) and np.all(stream.output_tokens >= 1)
    assert np.all(np.isfinite(stream.arrival_s)) and np.all(np.diff(stream.arrival_s) >= 0)


# ------------------------------------------------------------------------- 9. sweep grid
SWEEP = yaml.safe_load((ROOT / "scenarios" / "sweep_example.yaml").read_text())
GRID_KEYS = ["traffic.arrival.rate_rps", "deployment.gpu", "speculative.method", "speculative.num_speculative_tokens",
             "simulation.seed", "deployment.replicas", "engine.max_num_seqs", "nope.key", "", "a..b"]
grid_values = st.lists(nasty_scalar, min_size=0, max_size=4) | nasty_scalar | st.just(list(range(10)))


@fuzz(250)
@given(product=st.dictionaries(st.sampled_from(GRID_KEYS), grid_values, max_size=3),
       zipped=st.dictionaries(st.sampled_from(GRID_KEYS), grid_values, max_size=2),
       extra=st.sampled_from([None, "bad", 7, {"other": 1}]))
def test_fuzz_sweep_grid(product, zipped, extra):
    grid = {"product": product, "zip": zipped}
    if extra is not None:
        grid = {**grid, "extra": extra} if isinstance(extra, dict) else extra
    spec = outcome(sweep_mod.spec_from_dict, {**SWEEP, "sweep": grid}, "sweep.yaml")
    if isinstance(spec, CapacityError):
        return
    assert 1 <= len(spec.points) <= getattr(sweep_mod, "MAX_POINTS", 10**6)
    for p in spec.points[:3]:
        res = outcome(sweep_mod.point_scenario, spec.base, p, "sweep.yaml")
        if not isinstance(res, CapacityError):
            check_scenario(res)
