"""Every bad input of issue 19 gives one line on stderr and exit status 2 (a test per cause).

Each test writes the malformed input itself, runs the real CLI in-process and checks the status, that
stderr is exactly one `capacity: error:` line, and that the line names what is wrong (the key, column
or option) - the independent truth is the mutation the test made. Inputs that should still work are
checked to keep working (the shipped measurement file, a valid result, a valid scenario).
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import pytest
import yaml

from capacity import cli
from capacity.measurements import readers
from capacity.measurements.schemas import default_serving_file, read_measurements, read_spec_measurements
from capacity.paths import data_dir

DATA = Path(__file__).parent / "data" / "vllm"
RESULT = DATA / "bench_serve_result_nodetail.json"
LOG = DATA / "specdecode_club3090_vllm0.20.1.log"
SMALL = ["--set", "traffic.num_requests=20"]
# 316 bytes that expand to 490 million list items (the 439-byte bomb has the same shape)
BOMB = "{" + ", ".join(
    [f"a: &a [{','.join('x' * 9)}]"]
    + [f"{c}: &{c} [{','.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]) + "}"


def run(argv: list[str], capsys) -> tuple[int, list[str], str]:
    """(exit status, stderr lines, stdout) of `capacity ARGV`."""
    rc = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.err.strip().splitlines(), out.out


def refused(argv: list[str], capsys, *words: str) -> str:
    """Assert exit 2 with one error line naming every word; return the line."""
    rc, err, _ = run(argv, capsys)
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("capacity: error: "), err
    for w in words:
        assert w in err[0], (w, err[0])
    assert len(err[0]) < 400, err[0]          # the bad value is quoted short
    return err[0]


# ---------------------------------------------------------------- vllm bench serve results
def _result(tmp_path: Path, **changes) -> Path:
    res = json.loads(RESULT.read_text())
    res.update({"tensor_parallel_size": 1, "gpu": "MI300X"}, **changes)
    path = tmp_path / "result.json"
    path.write_text(json.dumps(res))           # inf is written as Infinity, as Python's json does
    return path


@pytest.mark.parametrize("key,value", [
    ("completed", None), ("completed", float("inf")), ("completed", "abc"), ("completed", 2.5),
    ("completed", -1), ("total_output_tokens", -100), ("total_input_tokens", float("nan")),
    ("duration", 0), ("output_throughput", "fast"), ("median_ttft_ms", -3.0), ("failed", 1.5),
    ("tensor_parallel_size", 0), ("tensor_parallel_size", 2.5), ("max_concurrency", 0),
    ("input_lens", "many"), ("model_id", "m" * 300),
])
def test_vllm_result_bad_key(tmp_path, capsys, key, value):
    line = refused(["validate", _result(tmp_path, **{key: value}), "--quiet", "--workers", "1"], capsys, key)
    assert "result.json" in line


def test_vllm_result_good_still_reads(tmp_path):
    df = readers.read_vllm_results(_result(tmp_path))
    assert len(df) == 1 and df["tp"][0] == 1 and df["num_prompts"][0] == 6


# ---------------------------------------------------------------- serving CSV
def _modelled_row() -> tuple[list[str], dict[str, str]]:
    with default_serving_file().open() as f:
        rows = list(csv.DictReader(f))
    row = next(r for r in rows if r["tp"] == "1.0" and r["gpu"] == "MI300X" and "closed" in r["load_type"]
               and r["spec_method"] in ("", "none") and r["framework"].lower().startswith("vllm"))
    return list(rows[0].keys()), row


def _serving_csv(tmp_path: Path, **changes) -> Path:
    header, row = _modelled_row()
    path = tmp_path / "serving.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, header)
        w.writeheader()
        w.writerow({**row, **changes})
    return path


@pytest.mark.parametrize("column,value", [
    ("tp", "0"), ("tp", "inf"), ("tp", "2.5"), ("tp", "-1"), ("isl", "0"), ("isl", "-5"), ("osl", "many"),
    ("num_gpus", "1e9"), ("num_gpus", "0.5"), ("precision", "fp88"), ("concurrency_or_qps", "2.5"),
    ("concurrency_or_qps", "-4"), ("model", "x" * 300), ("gpu", "\n"),
])
def test_serving_csv_bad_cell(tmp_path, capsys, column, value):
    words = ["serving.csv row 1", column]
    refused(["validate", _serving_csv(tmp_path, **{column: value}), "--quiet", "--workers", "1"], capsys, *words)


def test_serving_csv_tp_must_divide_the_gpus(tmp_path, capsys):
    refused(["validate", _serving_csv(tmp_path, tp="2", num_gpus="3"), "--quiet"], capsys,
            "num_gpus 3 is not a multiple of tp 2")


@pytest.mark.parametrize("column,value", [
    ("num_speculative_tokens", ""), ("num_speculative_tokens", "2.5"), ("tp", "0"), ("per_position_acceptance", "1.5"),
    ("per_position_acceptance", "x y"), ("mean_accepted_length", "0.5"), ("speedup", "-1"), ("precision", "fp88"),
])
def test_spec_csv_bad_cell(tmp_path, capsys, column, value):
    lines = (data_dir() / "measurements" / "seed_spec_decode.csv").read_text().splitlines()
    with (tmp_path / "spec.csv").open("w", newline="") as f:
        rows = list(csv.DictReader(lines[:2]))
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerow({**rows[0], column: value})
    refused(["validate", tmp_path / "spec.csv", "--quiet"], capsys, "spec.csv", column)


def test_measurement_file_too_large_or_name_too_long(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(readers, "MAX_FILE_BYTES", 1000)
    big = tmp_path / "big.csv"
    big.write_text("x" * 2000)
    refused(["validate", big, "--quiet"], capsys, "big.csv", "2,000 bytes")
    refused(["validate", "z" * 400, "--quiet"], capsys, "not found", "(400 characters)")


def test_shipped_serving_file_passes_the_row_checks():
    assert len(read_measurements(default_serving_file())) > 1000
    assert len(read_spec_measurements(data_dir() / "measurements" / "seed_spec_decode.csv")) > 200


# ---------------------------------------------------------------- /metrics and server logs
def _prom(tmp_path: Path, positions=("0", "1", "2"), drafts=100, draft_tokens=300, accepted=150,
          per_pos=(80, 50, 20)) -> Path:
    lines = [f'vllm:spec_decode_num_drafts_total{{engine="0"}} {drafts}',
             f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {draft_tokens}',
             f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {accepted}']
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{p}"}} {v}'
              for p, v in zip(positions, per_pos)]
    path = tmp_path / "metrics.prom"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_prometheus_good_reads(tmp_path):
    rec = readers.read_prometheus(_prom(tmp_path))
    assert rec.num_spec_tokens == 3 and rec.marginal.tolist() == [0.8, 0.5, 0.2]


@pytest.mark.parametrize("kw,word", [
    ({"positions": ("x", "1", "2")}, 'position="x"'),
    ({"positions": ("999999999999", "1", "2")}, 'position="999999999999"'),
    ({"accepted": -5}, "accepted_tokens_total is -5"),
    ({"draft_tokens": 100, "accepted": 250, "per_pos": (100, 100, 50)}, "accepted <= drafted"),
    ({"accepted": 500, "per_pos": (100, 100, 100)}, "more than one per position"),
    ({"per_pos": (300, 200, 100)}, "acceptance rate above 1"),
    ({"per_pos": (80, -50, 20)}, "is -50"),
])
def test_prometheus_bad(tmp_path, capsys, kw, word):
    t0 = time.perf_counter()
    refused(["validate", _prom(tmp_path, **kw), "--quiet"], capsys, word)
    assert time.perf_counter() - t0 < 10        # position 10^12 once allocated a list that long


@pytest.mark.parametrize("old,new,word", [
    ("0.740, 0.473", "0.5.5, 0.473", "not comma-separated numbers"),
    ("0.740, 0.473", "1.740, 0.473", "in [0, 1]"),
    ("Accepted: 489 tokens", "Accepted: 48900 tokens", "accepted <= drafted"),
    ("Accepted: 489 tokens", "Accepted: -489 tokens", "counts are >= 0"),
])
def test_server_log_bad(tmp_path, capsys, old, new, word):
    path = tmp_path / "server.log"
    text = LOG.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    refused(["validate", path, "--quiet"], capsys, "server.log line", word)


# ---------------------------------------------------------------- YAML: --set values and files
@pytest.mark.parametrize("value,word", [
    ("traffic.arrival.rate_rps=[", "not valid YAML"),
    ("name=!!python/name:os.system", "tag not allowed"),
    ("name=!!python/object/apply:os.system [echo hi]", "tag not allowed"),
    ("plan=" + BOMB, "anchors and aliases"),
    ("speculative.overrides=" + BOMB, "anchors and aliases"),
    ("speculative.acceptance=" + BOMB, "anchors and aliases"),
    ("speculative.policy=" + BOMB, "anchors and aliases"),
    ("deployment.gpu_overrides=&a [*a]", "recursive"),
    ("plan=" + "[" * 60 + "]" * 60, "nested more than"),
    ("plan=" + "[" * 5000 + "]" * 5000, "YAML"),
])
def test_set_values_bounded(capsys, value, word):
    t0 = time.perf_counter()
    refused(["simulate", "--set", value], capsys, "--set", word)
    assert time.perf_counter() - t0 < 10        # the bomb hung simulate before


def test_scenario_file_alias_bomb_and_depth(tmp_path, capsys):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(Path("scenarios/default.yaml").read_text() + f"\nextra: {BOMB}\n")
    refused(["simulate", bomb], capsys, "bomb.yaml", "anchors and aliases")
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: deep\nplan: " + "[" * 60 + "]" * 60 + "\n")
    refused(["simulate", deep], capsys, "deep.yaml", "nested more than 50")


def test_small_aliases_still_work(tmp_path):
    from capacity.inputs import safe_yaml, scenario
    assert safe_yaml.loads("a: &x [1, 2]\nb: *x", "t") == {"a": [1, 2], "b": [1, 2]}
    data = yaml.safe_load(Path("scenarios/default.yaml").read_text())
    data.pop("description", None)
    text = yaml.safe_dump(data, sort_keys=False).replace(f"name: {data['name']}\n", f"name: &n {data['name']}\n", 1)
    path = tmp_path / "alias.yaml"
    path.write_text(text + "description: *n\n")
    sc = scenario.load(str(path))
    assert sc.description == sc.name == data["name"]


def test_non_utf8_scenario(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    refused(["simulate", path], capsys, "latin1.yaml", "not UTF-8")


def test_hardware_profile_alias_bomb(tmp_path, capsys):
    path = tmp_path / "gpu.yaml"
    path.write_text(f"name: X\nvendor: {BOMB}\n")
    refused(["simulate", "--set", f"deployment.gpu={path}"], capsys, "hw profile", "anchors and aliases")


# ---------------------------------------------------------------- scenario values and options
@pytest.mark.parametrize("sets,word", [
    (["deployment.model=" + "a" * 300], "deployment.model"),
    (["deployment.gpu=" + "g" * 300], "deployment.gpu"),
    (["name=" + "n" * 1_000_000], "name"),
    (["deployment.tensor_parallel_size=2.5"], "tensor_parallel_size"),
    (["speculative.method=gemma4_mtp", "speculative.num_speculative_tokens=" + "1" + "0" * 30],
     "num_speculative_tokens"),
    (["speculative.method=gemma4_mtp", "speculative.num_speculative_tokens=3",
      "speculative.acceptance={dataset: chat}", "speculative.policy={kind: goodput, max_n: 1000000000}"], "max_n"),
    (["simulation.seed=-1"], "simulation.seed"),
    (["deployment.gpu_overrides={cost_per_gpu_hour_usd: .inf}"], "gpu_overrides"),
    (["plan.target_rate_rps=.nan"], "plan"),
    (["deployment.precision=fp88"], "fp88"),
])
def test_scenario_values(capsys, sets, word):
    argv = ["simulate"]
    for s in sets:
        argv += ["--set", s]
    refused(argv, capsys, word)


@pytest.mark.parametrize("argv,word", [
    (["simulate", "--seed", "-1"], "--seed -1"),
    (["simulate", "--seed", str(2**64)], "--seed"),
    (["validate", "--workers", "0"], "--workers 0"),
    (["validate", "--tp", "0", str(RESULT)], "--tp 0"),
    (["calibrate", "--gpu", "MI300X", "--rounds", "0"], "--rounds 0"),
    (["calibrate", "--gpu", "MI300X", "--prior-weight", "nan"], "--prior-weight"),
    (["calibrate", "--gpu", "MI300X", "--prior-weight", "gemma=10"], "--prior-weight gemma"),
    (["calibrate", "--gpu", "MI300X", "--prior-weight", "gemm=ten"], "--prior-weight gemm=ten"),
    (["calibrate", "--gpu", "MI300X", "--prior-weight", "gemm=-1"], "--prior-weight -1"),
    (["calibrate", "--gpu", "MI300X", "--holdout", "nan"], "--holdout"),
    (["calibrate", "--gpu", "MI300X", "--hold", "gemma"], "--hold gemma"),
    (["calibrate", "--gpu", "MI300X", "--fit", "gemm"], "--fit gemm"),
])
def test_options(capsys, argv, word):
    t0 = time.perf_counter()
    refused(argv, capsys, word)
    assert time.perf_counter() - t0 < 10        # --rounds 0 ran a whole calibration before failing


@pytest.mark.parametrize("argv,word", [
    (["calibrate", "--gpu", "g" * 5000], "--gpu"),
    (["validate", str(RESULT), "--model", "m" * 5000], "--model"),
    (["report", "r" * 5000], "RESULTS"),
    (["simulate", "s" * 5000], "SCENARIO"),
    (["simulate", "--set", "slo=" + "x" * 5000], "slo"),
    (["simulate", "--set", "speculative.method=" + "x" * 5000], "speculative.method"),
    (["simulate", "--set", "description=" + "x" * 20000], "description"),
])
def test_long_values_are_quoted_short(capsys, argv, word):
    refused(argv, capsys, word)


def test_out_naming_an_existing_file(tmp_path, capsys):
    f = tmp_path / "taken"
    f.write_text("keep me")
    refused(["simulate", "--out", f, *SMALL], capsys, "--out", "a file of that name exists")
    assert f.read_text() == "keep me"
    refused(["calibrate", "--gpu", "MI300X", "--out", tmp_path], capsys, "--out", "a folder")


def test_sweep_seed_minus_one_refused_before_running(tmp_path, capsys):
    data = yaml.safe_load(Path("scenarios/sweep_example.yaml").read_text())
    data["sweep"] = {"product": {"simulation.seed": [-1, 0]}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    refused(["sweep", path, "--list"], capsys, "simulation.seed=-1", "greater than or equal to 0")
    refused(["sweep", path, "--out", tmp_path / "out", "--quiet"], capsys, "simulation.seed")
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_sweep_grid_too_large_even_with_list(tmp_path, capsys):
    data = yaml.safe_load(Path("scenarios/sweep_example.yaml").read_text())
    data["sweep"] = {"product": {f"deployment.gpu_overrides.k{i}": list(range(10)) for i in range(10)}}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(data))
    t0 = time.perf_counter()
    refused(["sweep", path, "--list"], capsys, "10,000,000,000 points")
    assert time.perf_counter() - t0 < 10


# ---------------------------------------------------------------- report folders
@pytest.mark.parametrize("text", ['{"kind": "plan", broken', "[]", "null", '{"recommendation": 5}',
                                  '{"recommendation": {"replicas": [1]}, "candidates": 3}', "\xff"])
def test_report_malformed_plan_json(tmp_path, capsys, text):
    folder = tmp_path / "res"
    folder.mkdir()
    (folder / "plan.json").write_text(text, encoding="latin-1")
    refused(["report", folder, "--out", tmp_path / "r.html"], capsys, "res")
    assert not (tmp_path / "r.html").exists()


def test_plan_target_rate_inf(capsys):
    refused(["plan", "--set", "plan.target_rate_rps=.inf"], capsys, "target_rate_rps")


def test_plan_section_errors_name_the_key(capsys):
    refused(["plan", "--set", "plan.headroom=abc"], capsys, "plan: headroom")
    refused(["plan", "--set", "plan.search.speculative=[{method: bogus, num_speculative_tokens: 0}]"], capsys,
            "unknown speculative method 'bogus'")
    refused(["plan", "--set", "plan.search.speculative=[{method: eagle3, num_speculative_tokens: 1000}]"], capsys,
            "num_speculative_tokens")


def test_plan_refuses_an_unknown_gpu_or_model_before_it_searches(capsys):
    """A name nothing knows is bad input: one line at once (no search progress first), not 'no candidate meets the
    SLOs' after screening every candidate."""
    for setting, word in (('plan.search.gpu=["MI300X", "MI999"]', "unknown GPU 'MI999'"),
                          ("deployment.model=nonexistent/model", "unknown model 'nonexistent/model'")):
        rc, err, _ = run(["plan", "--set", setting], capsys)
        assert rc == 2 and len(err) == 1 and err[0].startswith("capacity: error: " + word), err
        assert "no candidate meets" not in err[0]


# ---------------------------------------------------------------- the text summary
def test_summary_with_metrics_missing(capsys):
    """A horizon so short that nothing finishes: the summary prints '-' for what it cannot compute."""
    rc, err, out = run(["simulate", "chatbot_single_turn", "--set", "simulation.max_sim_time_s=1", *SMALL], capsys)
    assert rc == 0, err
    assert "Traceback" not in "\n".join(err)
    ttft = next(line for line in out.splitlines() if line.startswith("TTFT ms"))
    assert ttft.split()[2:] == ["-", "-", "-", "-"]


def test_trace_with_a_huge_token_count_is_refused(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0.0,100,20\n1.0,1e12,20\n")
    refused(["simulate", "--no-compare", "--set", f"traffic.arrival={{process: trace, path: {trace}}}",
             "--set", "traffic.classes=[]"], capsys, "data row 2", "1e12")


def test_rocm_attn_on_a_gpu_that_is_not_amd(capsys):
    """vLLM's ROCM_ATTN exists only on ROCm (vllm/platforms/rocm.py); asking for it on an NVIDIA GPU is a mistake."""
    refused(["simulate", "--set", "deployment.gpu=H100", "--set", "engine.attention_backend=rocm", *SMALL], capsys,
            "attention_backend", "ROCM_ATTN", "H100")


def test_rocm_attn_for_a_model_whose_heads_it_does_not_take(capsys):
    """ROCM_ATTN takes head sizes up to 256 (RocmAttentionBackend.get_supported_head_sizes); Gemma 4's global layers
    have 512, so vLLM refuses it ('head_size not supported', vLLM PR #38824) and runs TRITON_ATTN."""
    refused(["simulate", "--set", "engine.attention_backend=rocm", *SMALL], capsys,   # the default: gemma-4-31B-it
            "attention_backend", "ROCM_ATTN", "512")


def test_aiters_fused_moe_on_a_gpu_that_is_not_amd(capsys):
    """AITER is AMD's kernel library (vLLM uses it only on ROCm, VLLM_ROCM_USE_AITER); asking for its fused MoE on an
    NVIDIA GPU is a mistake, and a backend vLLM does not have is refused by the schema."""
    refused(["simulate", "--set", "deployment.gpu=H100", "--set", "engine.moe_backend=aiter", *SMALL], capsys,
            "moe_backend", "AITER", "H100")
    refused(["simulate", "--set", "engine.moe_backend=cutlass", *SMALL], capsys, "moe_backend", "aiter")
