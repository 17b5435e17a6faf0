"""scenarios/README.md is what its generator writes, names every scenario key, and its notes on the
free-form values agree with the modules that read them."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel

from capacity.errors import CapacityError
from capacity.inputs import scenario, scenario_doc
from capacity.inputs.scenario import Scenario
from capacity.paths import scenarios_dir

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "scenarios" / "README.md"


def test_readme_is_what_the_generator_writes():
    assert README.is_file(), f"scenarios/README.md is missing; write it with `{scenario_doc.REGENERATE}`"
    assert README.read_text(encoding="utf-8") == scenario_doc.render_markdown(), (
        f"scenarios/README.md is out of date with the scenario schema; regenerate it with "
        f"`{scenario_doc.REGENERATE}`")


def _models(model: type[BaseModel], seen: dict[str, type[BaseModel]]) -> dict[str, type[BaseModel]]:
    """Every pydantic model reachable from `model` through its fields' annotations (found here
    independently of the generator's own walk)."""
    seen[model.__name__] = model
    for info in model.model_fields.values():
        stack = [info.annotation]
        while stack:
            tp = stack.pop()
            if isinstance(tp, type) and issubclass(tp, BaseModel):
                if tp.__name__ not in seen:
                    _models(tp, seen)
            else:
                stack.extend(getattr(tp, "__args__", ()))
    return seen


def _sections(text: str) -> dict[str, str]:
    """Model name -> the Markdown of its section (headings '### ... — ModelName')."""
    out = {}
    for part in re.split(r"^### ", text, flags=re.M)[1:]:
        heading = part.splitlines()[0]
        if " — " in heading:
            out[heading.rsplit(" — ", 1)[1].strip()] = part
    return out


def test_every_field_of_every_model_has_a_row_with_a_meaning():
    models = _models(Scenario, {})
    assert {"Deployment", "Engine", "Speculative", "Simulation", "TrafficConfig", "RequestClass",
            "PoissonArrivals", "GammaArrivals", "ClosedLoop", "TraceArrivals", "FixedLength", "UniformLength",
            "RangeRatioLength", "LognormalLength", "EmpiricalLength"} <= set(models)
    sections = _sections(README.read_text(encoding="utf-8"))
    for name, model in models.items():
        assert name in sections, f"no section for {name} in scenarios/README.md"
        rows = {}
        for line in sections[name].splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            m = re.fullmatch(r"`([^`]+)`", cells[0]) if line.startswith("| `") else None
            if m:
                rows[m.group(1).rsplit(".", 1)[-1]] = cells
        for field in model.model_fields:
            assert field in rows, f"{name}.{field} has no row in scenarios/README.md"
            assert len(rows[field]) == 5 and rows[field][4], f"{name}.{field} has no meaning in scenarios/README.md"


def test_units_follow_the_field_names():
    rows = {r.key.strip("`"): r for s in scenario_doc.sections() for r in s.rows}
    assert rows["traffic.arrival.rate_rps"].unit == "requests/s"
    assert rows["traffic.duration_s"].unit == "s"
    assert rows["simulation.max_sim_time_s"].unit == "s"
    assert rows["engine.activation_reserve_gb"].unit == "GB"
    assert rows["engine.max_num_batched_tokens"].unit == "tokens"
    assert rows["engine.block_size"].unit == "tokens"
    assert rows["deployment.replicas"].unit == ""


def _note(key: str) -> str:
    (note,) = [n for n in scenario_doc.free_form_notes() if key in n.keys]
    return note.text


def _allowed(call) -> list[str]:
    """The keys an error message lists after 'allowed: '."""
    with pytest.raises(CapacityError) as e:
        call()
    return [k.strip() for k in str(e.value).split("allowed: ", 1)[1].split(",")]


def test_plan_note_names_every_plan_key_and_default():
    from capacity.studies.plan import PlanConfig, SearchSpace, SpecOption

    text = _note("plan")
    for model in (PlanConfig, SearchSpace, SpecOption):
        for field in model.model_fields:
            assert re.search(rf"\b{field}\b", text), f"plan note misses {model.__name__}.{field}"
    for name, info in PlanConfig.model_fields.items():
        if isinstance(info.default, (int, float)) and not isinstance(info.default, bool):
            assert f"`{name}` (default {info.default:g}" in text


def test_policy_and_acceptance_notes_name_every_key_their_readers_allow():
    from capacity.spec.acceptance import MODELS, acceptance_from_config
    from capacity.spec.policies import POLICY_KINDS, policy_from_config

    policy = _note("speculative.policy")
    for kind in POLICY_KINDS:
        assert f"kind: {kind}" in policy
        for key in _allowed(lambda: policy_from_config({"kind": kind, "no_such_key": 1}, 3)):
            assert re.search(rf"\b{key}\b", policy), f"speculative.policy note misses {kind}.{key}"
    acceptance = _note("speculative.acceptance")
    for model in MODELS:
        assert f"model: {model}" in acceptance
        for key in _allowed(lambda: acceptance_from_config({"model": model, "no_such_key": 1}, method="eagle3",
                                                           target="Qwen/Qwen3-8B")):
            assert re.search(rf"\b{key}\b", acceptance), f"acceptance note misses {model}.{key}"


def test_method_notes_are_the_methods_the_simulator_knows():
    from capacity.spec.methods import get_method, list_methods

    text = _note("speculative.method")
    names = [m.name for m in list_methods()]
    assert re.findall(r"^\* `([a-z0-9_]+)`", text, flags=re.M) == names
    for m in list_methods():
        for alias in m.aliases:
            assert f"`{alias}`" in text and get_method(alias).name == m.name
    overrides = _note("speculative.overrides")
    for m in list_methods():
        for p in m.parameters:
            assert f"`{p}`" in overrides


def test_sweep_and_slo_notes_match_their_readers():
    from capacity.sim import metrics

    assert "`product`" in _note("sweep") and "`zip`" in _note("sweep")
    for metric in metrics.LATENCY_METRICS + metrics.RATE_METRICS:
        assert f"`{metric}`" in _note("slo")


def test_the_unknown_key_error_points_at_the_readme_that_is_shipped():
    with pytest.raises(CapacityError) as e:
        scenario.from_dict({"deployment": {"model": "Qwen/Qwen3-8B", "tensor_paralel_size": 2},
                            "traffic": {"arrival": {"process": "closed_loop", "concurrency": 1}, "num_requests": 1,
                                        "classes": [{"name": "c", "input_tokens": {"dist": "fixed", "value": 1},
                                                     "output_tokens": {"dist": "fixed", "value": 1}}]}})
    message = str(e.value)
    assert "deployment.tensor_paralel_size: unknown key" in message
    (named,) = re.findall(r"see (\S+\.md)", message)
    assert (ROOT / named).is_file()
    assert (scenarios_dir() / Path(named).name).is_file()          # where an installed package has it
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["tool"]["setuptools"]["package-dir"]["capacity.scenarios"] == "scenarios"
    assert "*.md" in pyproject["tool"]["setuptools"]["package-data"]["capacity.scenarios"]


def test_check_mode_reports_a_stale_readme(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "README.md"
    stale.write_text("old\n", encoding="utf-8")
    monkeypatch.setattr(scenario_doc, "readme_path", lambda: stale)
    assert scenario_doc.main(["--check"]) == 1
    assert scenario_doc.REGENERATE in capsys.readouterr().err
    assert scenario_doc.main([]) == 0 and scenario_doc.main(["--check"]) == 0
    assert stale.read_text(encoding="utf-8") == scenario_doc.render_markdown()


def test_switching_the_arrival_process_drops_only_the_keys_it_does_not_take():
    """`--set traffic.arrival.process=...` on a Poisson scenario (issue 18: it used to need rate_rps removed by
    hand): the new process keeps the keys it shares and loses the others; a misspelled key still fails."""
    from capacity.errors import CapacityError
    from capacity.inputs import scenario

    base = {"traffic": {"arrival": {"process": "poisson", "rate_rps": 3.0, "vllm_rescale": False}}}
    trace = scenario.apply_overrides(copy.deepcopy(base), ["traffic.arrival.process=trace",
                                                           "traffic.arrival.path=azure2023_conv"])
    assert trace["traffic"]["arrival"] == {"process": "trace", "path": "azure2023_conv"}
    gamma = scenario.apply_overrides(copy.deepcopy(base), ["traffic.arrival.process=gamma",
                                                           "traffic.arrival.burstiness=0.5"])
    assert gamma["traffic"]["arrival"] == {"process": "gamma", "rate_rps": 3.0, "vllm_rescale": False, "burstiness": 0.5}
    with pytest.raises(CapacityError, match="concurrency"):          # the misspelling is not silently dropped
        scenario.load(None, ["traffic.arrival.process=closed_loop", "traffic.arrival.concurency=4"])
