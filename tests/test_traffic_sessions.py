"""Multi-turn sessions and prefix-block identities (capacity/inputs/traffic.py, issue 17), against
independent truth: prompts rebuilt from the drawn lengths, block identities checked against the token
sequences they stand for (built here from the session / trace structure, not from the key encoding),
sampling moments within their standard errors, exact means from scipy, and the Mooncake trace's
published statistics and sha256.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from capacity import cli
from capacity.errors import CapacityError
from capacity.inputs.scenario import from_dict, load
from capacity.inputs.traffic import (
    EmpiricalLength,
    FixedLength,
    LognormalLength,
    PrefixKeys,
    RangeRatioLength,
    SessionKeys,
    TraceBlockKeys,
    TrafficConfig,
    UniformLength,
    build_requests,
    expected_requests_per_session,
    mean_length,
    read_trace,
    resolve_trace,
    sample_lengths,
    shipped_traces,
)
from capacity.paths import data_dir

Z = 5.0  # tolerance in standard errors for the statistical tests
MOONCAKE = data_dir() / "traces" / "mooncake_conversation.jsonl.gz"
TRACES_README = data_dir() / "traces" / "README.md"


def sessions_config(classes: list[dict], **arrival) -> TrafficConfig:
    top = {k: arrival.pop(k) for k in ("num_requests", "duration_s") if k in arrival}
    return TrafficConfig.model_validate({
        "arrival": {"process": "sessions", "rate_sessions_per_s": 2.0, **arrival}, "classes": classes, **top})


def chat_class(name="support", system=40, turns=None, user=None, answer=None, think=None, weight=1.0) -> dict:
    c = {"name": name, "weight": weight, "system_prompt_tokens": system,
         "turns": turns or {"dist": "uniform", "low": 1, "high": 6},
         "input_tokens": user or {"dist": "uniform", "low": 3, "high": 40},
         "output_tokens": answer or {"dist": "uniform", "low": 1, "high": 50}}
    if think is not None:
        c["think_time_s"] = think
    return c


def shipped_scenario(process: str) -> str:
    """The shipped chatbot scenario whose arrival process is `process`: the multi-turn chatbot is `default`
    (`chatbot_multiturn` before the default became multi-turn), the single-turn one `chatbot_single_turn`
    (`default` before)."""
    for name in ("default", "chatbot_multiturn", "chatbot_single_turn"):
        try:
            scenario = load(name)
        except CapacityError:
            continue
        if scenario.traffic.arrival.process == process:
            return name
    raise AssertionError(f"no shipped chatbot scenario with arrival process {process}")


def chains(stream) -> list[list[int]]:
    """Each session's requests in turn order, walked along `follows` (first turn: follows == -1)."""
    nxt = {int(f): i for i, f in enumerate(stream.follows) if f >= 0}
    out = []
    for first in np.flatnonzero(stream.follows < 0):
        chain = [int(first)]
        while chain[-1] in nxt:
            chain.append(nxt[chain[-1]])
        out.append(chain)
    return out


# ---------------------------------------------------------------------------------------------
# Structure
# ---------------------------------------------------------------------------------------------


def test_turn_prompt_is_system_history_and_new_message() -> None:
    """Fixed user messages: prompt_k = system + sum_{i<k} (user + answer_i) + user, recomputed from the
    drawn answers; with drawn user messages each prompt_{k+1} - prompt_k - output_k is a user message."""
    cfg = sessions_config([chat_class("a", system=37, user={"dist": "fixed", "value": 11}),
                           chat_class("b", system=0, user={"dist": "fixed", "value": 5})], num_sessions=300)
    s = build_requests(cfg, np.random.default_rng(3))
    system = {0: 37, 1: 0}
    user = {0: 11, 1: 5}
    for chain in chains(s):
        c = int(s.class_index[chain[0]])
        history = 0
        for r in chain:
            assert s.class_index[r] == c
            assert s.prompt_tokens[r] == system[c] + history + user[c]
            history += user[c] + int(s.output_tokens[r])
    cfg = sessions_config([chat_class(system=25)], num_sessions=300)
    s = build_requests(cfg, np.random.default_rng(4))
    for chain in chains(s):
        assert 3 <= s.prompt_tokens[chain[0]] - 25 <= 40
        for prev, cur in zip(chain, chain[1:]):
            assert 3 <= s.prompt_tokens[cur] - s.prompt_tokens[prev] - s.output_tokens[prev] <= 40
        assert all(1 <= s.output_tokens[r] <= 50 for r in chain)


def test_follows_think_and_arrival_are_consistent() -> None:
    cfg = sessions_config([chat_class(think={"dist": "exponential", "mean": 4.0})], num_sessions=500)
    s = build_requests(cfg, np.random.default_rng(1))
    n, first = len(s), s.follows < 0
    num_sessions = int(first.sum())
    assert num_sessions == 500 and s.concurrency is None
    assert np.all(first[:num_sessions]) and not np.any(first[num_sessions:])     # first turns come first
    assert np.all(np.isfinite(s.arrival_s[first])) and np.all(np.diff(s.arrival_s[first]) >= 0)
    assert np.all(np.isnan(s.arrival_s[~first]))
    assert np.all(s.think_s[first] == 0.0) and np.all(s.think_s[~first] > 0.0)
    assert s.session.dtype == np.int64 and s.follows.dtype == np.int64 and s.think_s.dtype == np.float64
    seen = np.zeros(n, dtype=int)
    for chain in chains(s):
        assert len(set(s.session[chain].tolist())) == 1                          # one session per chain
        assert len(chain) <= 6
        seen[chain] += 1
    assert np.all(seen == 1)                                                     # every request in one chain
    assert len(set(s.session[first].tolist())) == num_sessions
    # think times are exponential with mean 4 s
    later = s.think_s[~first]
    assert abs(later.mean() - 4.0) < Z * 4.0 / math.sqrt(len(later))
    fixed = build_requests(sessions_config([chat_class(think={"dist": "fixed", "value": 2.5})], num_sessions=50),
                           np.random.default_rng(1))
    assert set(fixed.think_s[fixed.follows >= 0].tolist()) == {2.5}
    no_think = build_requests(sessions_config([chat_class()], num_sessions=50), np.random.default_rng(1))
    assert np.all(no_think.think_s == 0.0)


def _sequences(s, system: dict[int, int]) -> list[list[tuple]]:
    """Each request's token sequence (prompt, then answer), built from the session structure alone:
    class c's system prompt is tokens ('sys', c, i); a session's messages and answers are tokens unique
    to (session, turn, role, i)."""
    seqs: list[list[tuple]] = [[] for _ in range(len(s))]
    for chain in chains(s):
        c, sid = int(s.class_index[chain[0]]), int(s.session[chain[0]])
        tokens = [("sys", c, i) for i in range(system[c])]
        for k, r in enumerate(chain):
            user = int(s.prompt_tokens[r]) - len(tokens)
            assert user >= 1
            tokens = tokens + [(sid, k, "user", i) for i in range(user)]
            assert len(tokens) == s.prompt_tokens[r]
            tokens = tokens + [(sid, k, "answer", i) for i in range(int(s.output_tokens[r]))]
            seqs[r] = tokens
    return seqs


@pytest.mark.parametrize("block_size", [1, 7, 16, 64])
def test_equal_keys_are_equal_token_prefixes(block_size: int) -> None:
    """Over every block of every request: two keys are equal exactly when the token sequences up to
    the ends of their blocks are equal (vLLM's chained block hash), keys are non-negative ints, and a
    request has floor((prompt + output) / block_size) of them."""
    system = {0: 100, 1: 48}
    cfg = sessions_config([chat_class("a", system=100), chat_class("b", system=48)], num_sessions=40)
    s = build_requests(cfg, np.random.default_rng(5))
    assert isinstance(s.prefix_keys, SessionKeys) and isinstance(s.prefix_keys, PrefixKeys)
    key_of: dict[tuple, int] = {}
    content_of: dict[int, tuple] = {}
    for r, tokens in enumerate(_sequences(s, system)):
        keys = s.prefix_keys.block_keys(r, block_size)
        assert keys == s.prefix_keys.block_keys(r, block_size)                    # pure
        assert len(keys) == (s.prompt_tokens[r] + s.output_tokens[r]) // block_size
        assert all(type(k) is int and k >= 0 for k in keys)
        for j, key in enumerate(keys):
            content = hash(tuple(tokens[: (j + 1) * block_size]))
            assert key_of.setdefault(content, key) == key
            assert content_of.setdefault(key, content) == content


def test_next_turn_keys_start_with_this_turns_keys_and_system_blocks_are_shared() -> None:
    bs = 16
    cfg = sessions_config([chat_class("a", system=100, weight=1), chat_class("b", system=64, weight=1)],
                          num_sessions=200)
    s = build_requests(cfg, np.random.default_rng(9))
    keys = s.prefix_keys
    system_keys: dict[int, set[int]] = {0: set(), 1: set()}
    session_keys: dict[int, set[int]] = {}
    for chain in chains(s):
        c = int(s.class_index[chain[0]])
        shared = {0: 100 // bs, 1: 64 // bs}[c]                                   # blocks wholly in the system prompt
        for prev, cur in zip(chain, chain[1:]):
            a, b = keys.block_keys(prev, bs), keys.block_keys(cur, bs)
            assert b[: len(a)] == a                                              # the whole previous list
        own: set[int] = set()
        for r in chain:
            k = keys.block_keys(r, bs)
            system_keys[c].update(k[:shared])
            own.update(k[shared:])
        session_keys[int(s.session[chain[0]])] = own
    assert len(system_keys[0]) == 100 // bs and len(system_keys[1]) == 64 // bs  # one key set per class
    assert not system_keys[0] & system_keys[1]                                   # not shared across classes
    everything = set().union(*session_keys.values())
    assert len(everything) == sum(len(v) for v in session_keys.values())         # sessions share nothing else
    assert not everything & (system_keys[0] | system_keys[1])
    # the block that straddles class a's system prompt end (tokens 96..111) belongs to the session
    r = next(r for r in range(len(s)) if s.class_index[r] == 0 and len(keys.block_keys(r, bs)) > 6)
    assert keys.block_keys(r, bs)[6] not in system_keys[0]


# ---------------------------------------------------------------------------------------------
# Counts and arrivals
# ---------------------------------------------------------------------------------------------


def _lognormal_mean_by_scipy(median: float, sigma: float, low: int, high: int) -> float:
    """E[clip(rint(X), low, high)], X lognormal: sum_k k P(rint X = k) with the clipped masses."""
    from scipy import stats

    dist = stats.lognorm(s=sigma, scale=median)
    k = np.arange(low, high + 1, dtype=np.float64)
    edges = np.concatenate([[0.0], k[:-1] + 0.5, [np.inf]])            # rint(X) <= low <=> X < low + 1/2
    mass = np.diff(dist.cdf(edges))
    return float(np.dot(k, mass))


def test_expected_requests_per_session_is_exact_where_it_can_be() -> None:
    assert mean_length(FixedLength(value=4)) == 4.0
    assert mean_length(UniformLength(low=1, high=6)) == 3.5
    low, high = math.floor(10 * 0.7), math.ceil(10 * 1.3)             # vLLM's range-ratio bounds, by hand
    assert mean_length(RangeRatioLength(mean=10, range_ratio=0.3)) == (low + high) / 2
    column = read_trace("azure2023_conv")["output_tokens"].to_numpy()
    assert mean_length(EmpiricalLength(trace="azure2023_conv", column="output")) == pytest.approx(column.mean(), rel=1e-12)
    for median, sigma, lo, hi in [(1.45, 0.75, 1, 40), (3.0, 1.2, 2, 500), (2.0, 1.5, 1, 300_000)]:
        truth = _lognormal_mean_by_scipy(median, sigma, lo, hi)
        assert mean_length(LognormalLength(median=median, sigma=sigma, min=lo, max=hi)) == pytest.approx(truth, rel=1e-9)
    # no upper clip: beyond 100,000 terms the sum is closed-form; sigma 1.5 leaves P(X > 1e7) ~ 1e-23
    truth = _lognormal_mean_by_scipy(3.0, 1.5, 1, 10_000_000)
    assert mean_length(LognormalLength(median=3.0, sigma=1.5)) == pytest.approx(truth, rel=1e-9)
    cfg = sessions_config([chat_class("a", turns={"dist": "fixed", "value": 3}, weight=3),
                           chat_class("b", turns={"dist": "uniform", "low": 1, "high": 10}, weight=1)], num_sessions=1)
    assert expected_requests_per_session(cfg) == pytest.approx(0.75 * 3 + 0.25 * 5.5)
    with pytest.raises(CapacityError, match="sessions"):
        expected_requests_per_session(TrafficConfig.model_validate({
            "arrival": {"process": "poisson", "rate_rps": 1}, "num_requests": 1,
            "classes": [{"name": "c", "input_tokens": {"dist": "fixed", "value": 1},
                         "output_tokens": {"dist": "fixed", "value": 1}}]}))


@pytest.mark.parametrize("turns", [
    {"dist": "lognormal", "median": 1.45, "sigma": 0.75, "min": 1, "max": 40},
    {"dist": "uniform", "low": 1, "high": 9},
    {"dist": "lognormal", "median": 2.0, "sigma": 1.0},
])
def test_mean_turns_per_session_matches_the_expectation(turns: dict) -> None:
    """Sample mean of requests per session vs expected_requests_per_session: |diff| < 5 standard errors
    (SE = sample std of the per-session counts / sqrt(sessions))."""
    cfg = sessions_config([chat_class("a", turns=turns, weight=2), chat_class("b", turns={"dist": "fixed", "value": 2})],
                          num_sessions=20_000)
    s = build_requests(cfg, np.random.default_rng(11))
    counts = np.bincount(s.session)
    assert len(counts) == 20_000
    se = counts.std(ddof=1) / math.sqrt(len(counts))
    assert abs(counts.mean() - expected_requests_per_session(cfg)) < Z * se


def _gamma_cv_se(shape: float, n: int) -> float:
    """Delta-method standard error of the sample CV of n Gamma(shape) draws (as tests/test_traffic.py)."""
    k = shape
    m, var, mu3, mu4 = k, k, 2 * k, 3 * k * k + 6 * k
    return math.sqrt((var**2 / m**4 + (mu4 - var**2) / (4 * var * m**2) - mu3 / m**3) / n)


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_session_start_gaps_have_mean_one_over_rate_and_cv_one_over_sqrt_burstiness(burstiness: float) -> None:
    n, rate = 30_000, 0.5
    cfg = sessions_config([chat_class(turns={"dist": "fixed", "value": 1})], rate_sessions_per_s=rate,
                          burstiness=burstiness, num_sessions=n)
    s = build_requests(cfg, np.random.default_rng(2))
    gaps = np.diff(np.concatenate([[0.0], s.arrival_s]))          # the first session starts after one gap
    assert len(gaps) == n and np.all(gaps >= 0)
    mean_se = (1 / rate) / math.sqrt(burstiness) / math.sqrt(n)
    assert abs(gaps.mean() - 1 / rate) < Z * mean_se
    assert abs(gaps.std() / gaps.mean() - 1 / math.sqrt(burstiness)) < Z * _gamma_cv_se(burstiness, n)


def test_duration_and_num_requests_stop_the_sessions() -> None:
    cfg = sessions_config([chat_class()], rate_sessions_per_s=3.0, duration_s=200.0)
    s = build_requests(cfg, np.random.default_rng(0))
    starts = s.arrival_s[s.follows < 0]
    assert starts.max() < 200.0
    assert abs(len(starts) - 600) < Z * math.sqrt(600)                             # Poisson count, sd sqrt(600)
    both = build_requests(sessions_config([chat_class()], rate_sessions_per_s=3.0, duration_s=200.0, num_sessions=50),
                          np.random.default_rng(0))
    assert (both.follows < 0).sum() == 50
    # num_requests keeps turns session by session in start order: the same sessions, the last one cut short
    full = build_requests(sessions_config([chat_class()], num_sessions=400), np.random.default_rng(8))
    counts = np.bincount(full.session)
    cap = int(counts[:100].sum()) + 1                          # the first 100 sessions whole, then one turn
    capped = build_requests(sessions_config([chat_class()], num_sessions=400, num_requests=cap), np.random.default_rng(8))
    assert len(capped) == cap
    kept = np.bincount(capped.session)
    assert np.array_equal(kept[:100], counts[:100]) and kept[100] == 1 and len(kept) == 101
    assert np.array_equal(capped.arrival_s[capped.follows < 0], full.arrival_s[:101])
    for chain in chains(capped):                                                    # never a later turn alone
        assert capped.follows[chain[0]] == -1
    assert sessions_config([chat_class()], num_sessions=5, num_requests=10**6) is not None


def test_same_seed_same_stream_other_seed_differs() -> None:
    cfg = sessions_config([chat_class("a", think={"dist": "lognormal", "median": 7.18, "sigma": 0.6, "max": 600}),
                           chat_class("b", system=300, weight=0.5)], num_sessions=300)
    a, b = build_requests(cfg, np.random.default_rng(42)), build_requests(cfg, np.random.default_rng(42))
    c = build_requests(cfg, np.random.default_rng(43))
    for field in ("arrival_s", "prompt_tokens", "output_tokens", "class_index", "session", "follows", "think_s"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert all(a.prefix_keys.block_keys(r, 16) == b.prefix_keys.block_keys(r, 16) for r in range(len(a)))
    assert len(a) != len(c) or not np.array_equal(a.prompt_tokens, c.prompt_tokens)
    assert not np.array_equal(a.arrival_s[:300], c.arrival_s[:300])


def test_other_processes_are_unchanged_and_dump_without_session_keys() -> None:
    plain = {"arrival": {"process": "poisson", "rate_rps": 2.0}, "num_requests": 50,
             "classes": [{"name": "c", "input_tokens": {"dist": "fixed", "value": 10},
                          "output_tokens": {"dist": "fixed", "value": 5}}]}
    cfg = TrafficConfig.model_validate(plain)
    assert set(cfg.model_dump()["classes"][0]) == {"name", "weight", "input_tokens", "output_tokens"}
    assert TrafficConfig.model_validate(cfg.model_dump(mode="json")) == cfg
    s = build_requests(cfg, np.random.default_rng(0))
    assert s.prefix_keys is None and s.session is None and s.follows is None and s.think_s is None
    trace = build_requests(TrafficConfig.model_validate({"arrival": {"process": "trace", "path": "azure2023_conv"},
                                                         "num_requests": 20}), np.random.default_rng(0))
    assert trace.prefix_keys is None and trace.session is None
    session_cfg = load(shipped_scenario("sessions")).traffic
    assert TrafficConfig.model_validate(session_cfg.model_dump(mode="json")) == session_cfg


def test_shipped_chatbot_scenario_is_about_two_requests_per_second() -> None:
    """The single-turn chatbot's rate (2 requests/s, scenarios/chatbot_single_turn.yaml) as sessions/s x
    requests per session."""
    default = load(shipped_scenario("poisson")).traffic.arrival.rate_rps
    traffic = load(shipped_scenario("sessions")).traffic
    rate = traffic.arrival.rate_sessions_per_s * expected_requests_per_session(traffic)
    assert rate == pytest.approx(default, rel=0.01)
    (support,) = traffic.classes
    assert mean_length(support.input_tokens) == pytest.approx(69.5, rel=0.01)     # LMSYS-Chat-1M, Table 1
    assert mean_length(support.output_tokens) == pytest.approx(214.5, rel=0.01)
    assert mean_length(support.turns) == pytest.approx(2.0, rel=0.01)


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit status 2
# ---------------------------------------------------------------------------------------------


def refused(argv: list[str], capsys, *words: str) -> str:
    rc = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("capacity: error: "), err
    for w in words:
        assert w in err[0], (w, err[0])
    assert len(err[0]) < 400, err[0]
    return err[0]


# Each case sets its own traffic, so it does not depend on what the shipped default holds.
_POISSON = ["traffic.arrival={process: poisson, rate_rps: 2.0}", "traffic.num_requests=5"]
_SESSIONS = ["traffic.arrival={process: sessions, rate_sessions_per_s: 1.0, num_sessions: 3}",
             "traffic.classes=[{name: s, system_prompt_tokens: 10, turns: {dist: fixed, value: 2}, "
             "input_tokens: {dist: fixed, value: 9}, output_tokens: {dist: fixed, value: 9}}]"]
_CLASS = "traffic.classes=[{name: c, input_tokens: {dist: fixed, value: 9}, output_tokens: {dist: fixed, value: 9}, "


@pytest.mark.parametrize("sets,words", [
    (_SESSIONS[:1] + ["traffic.classes=[{name: s, input_tokens: {dist: fixed, value: 9}, "
                      "output_tokens: {dist: fixed, value: 9}}]"], ["class 's' has no turns", "sessions"]),
    (_POISSON + [_CLASS + "turns: {dist: fixed, value: 3}}]"], ["turns only apply", "'poisson'"]),
    (_POISSON + [_CLASS + "system_prompt_tokens: 100}]"], ["system_prompt_tokens only apply"]),
    (_POISSON + [_CLASS + "think_time_s: {dist: fixed, value: 1}}]"], ["think_time_s only apply"]),
    (["traffic.arrival={process: trace, path: azure2023_conv}", _CLASS + "turns: {dist: fixed, value: 3}}]"],
     ["turns only apply", "'trace'"]),
    (_SESSIONS + ["traffic.arrival.num_sessions=null", "traffic.duration_s=null"], ["num_sessions or duration_s"]),
    (_SESSIONS + ["traffic.arrival.num_sessions=0"], ["traffic.arrival.sessions.num_sessions"]),
    (_SESSIONS + ["traffic.arrival.rate_sessions_per_s=0"], ["rate_sessions_per_s"]),
    (_SESSIONS + ["traffic.arrival.rate_sessions_per_s=.inf"], ["rate_sessions_per_s"]),
    (_SESSIONS + ["traffic.arrival.rate_sessions_per_s=.nan"], ["rate_sessions_per_s"]),
    (_SESSIONS + ["traffic.arrival.burstiness=0"], ["burstiness"]),
    (_SESSIONS + ["traffic.arrival.num_sessions=100000000"], ["num_sessions 100000000", "limit"]),
    (_SESSIONS + ["traffic.classes.0.system_prompt_tokens=-1"], ["system_prompt_tokens"]),
    (_SESSIONS + ["traffic.classes.0.turns={dist: fixed, value: 0}"], ["turns"]),
    (_SESSIONS + ["traffic.classes.0.think_time_s={dist: lognormal, median: 7, sigma: 0}"], ["sigma"]),
    (_SESSIONS + ["traffic.classes.0.think_time_s={dist: exponential, mean: -1}"], ["mean"]),
    (_SESSIONS + ["traffic.classes.0.think_time_s={dist: fixed, value: .nan}"], ["value"]),
    (_SESSIONS + ["traffic.classes.0.think_time_s={dist: lognormal, median: .inf, sigma: 1}"], ["median"]),
    (_SESSIONS + ["traffic.classes.0.think_time_s={dist: weibull, scale: 3}"], ["think_time_s", "weibull"]),
])
def test_bad_session_input_is_one_line(capsys, sets: list[str], words: list[str]) -> None:
    argv = ["simulate", "default", "--no-compare"]
    for s in sets:
        argv += ["--set", s]
    refused(argv, capsys, *words)


def test_bad_session_config_raises_validation_errors() -> None:
    with pytest.raises(ValidationError, match="has no turns"):
        sessions_config([{"name": "x", "input_tokens": {"dist": "fixed", "value": 1},
                          "output_tokens": {"dist": "fixed", "value": 1}}], num_sessions=3)
    with pytest.raises(ValidationError, match="num_sessions or duration_s"):
        sessions_config([chat_class()])
    with pytest.raises(CapacityError, match="no session starts"):
        build_requests(sessions_config([chat_class()], rate_sessions_per_s=1e-9, duration_s=1.0),
                       np.random.default_rng(0))
    with pytest.raises(CapacityError) as e:
        from_dict({"deployment": {"model": "Qwen/Qwen3-8B"},
                   "traffic": {"arrival": {"process": "sessions", "rate_sessions_per_s": 1, "num_sessions": 2},
                               "classes": [chat_class(think={"dist": "fixed"})]}}, "s.yaml")
    assert str(e.value).startswith("s.yaml: traffic.classes.0.think_time_s.fixed.value") and "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------------
# Trace block ids (Mooncake)
# ---------------------------------------------------------------------------------------------


def test_trace_block_keys_on_hand_made_hash_ids() -> None:
    keys = TraceBlockKeys([[0, 1, 2], [0, 1, 5], [0, 1], [0, 7], [0, 1]], [1300, 1300, 1300, 1024, 1024],
                          hash_block_tokens=512)
    a, b = keys.block_keys(0, 16), keys.block_keys(1, 16)
    assert len(a) == len(b) == 1300 // 16 == 81
    shared = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
    assert shared == 64 and a[:64] == b[:64] and not set(a[64:]) & set(b[64:])
    # partial last trace block (tokens 1024..1299 of id 2): engine block 80 ends at token 1296, offset 272 in it
    assert a[80] == 2 * 513 + (1296 - 1024)
    assert a[63] == 1 * 513 + 512 and a[0] == 0 * 513 + 16
    # fewer ids than the prompt needs: keys stop where the ids do (blocks ending by token 1024)
    assert keys.block_keys(2, 16) == a[:64]
    # a block size that does not divide 512: block 5 (tokens 500..599) ends inside trace block 1
    c, d = keys.block_keys(3, 100), keys.block_keys(4, 100)
    assert len(c) == len(d) == 10
    assert c[:5] == d[:5] and c[5] == 7 * 513 + 88 and d[5] == 1 * 513 + 88
    assert keys.block_keys(0, 2000) == []
    assert isinstance(keys, PrefixKeys)


@pytest.mark.parametrize("block_size", [3, 4, 8, 13])
def test_trace_keys_are_equal_exactly_for_equal_token_prefixes(block_size: int) -> None:
    """Requests drawn as paths in a prefix tree, ids chained as in Mooncake (an id names the whole prefix
    to its block's end) and each id's tokens unique to it: engine-block keys are equal exactly when the
    prompt tokens up to the block ends are equal."""
    h = 8
    rng = np.random.default_rng(0)
    ids_of_prefix: dict[tuple, int] = {}
    hash_ids, lengths, tokens = [], [], []
    for _ in range(60):
        depth = int(rng.integers(1, 6))
        path = tuple(int(v) for v in rng.integers(0, 2, size=depth))        # few branches: much sharing
        ids = [ids_of_prefix.setdefault(path[: i + 1], len(ids_of_prefix)) for i in range(depth)]
        length = int(rng.integers((depth - 1) * h + 1, depth * h + 1))         # the last block may be partial
        seq = [(i, t) for i in ids for t in range(h)][:length]
        hash_ids.append(ids)
        lengths.append(length)
        tokens.append(seq)
    keys = TraceBlockKeys(hash_ids, lengths, hash_block_tokens=h)
    key_of: dict[tuple, int] = {}
    content_of: dict[int, tuple] = {}
    for r, seq in enumerate(tokens):
        ks = keys.block_keys(r, block_size)
        assert len(ks) == lengths[r] // block_size
        for j, key in enumerate(ks):
            content = tuple(seq[: (j + 1) * block_size])
            assert key_of.setdefault(content, key) == key
            assert content_of.setdefault(key, content) == content


def _readme_sha256() -> str:
    text = TRACES_README.read_text(encoding="utf-8")
    (digest,) = re.findall(r"^([0-9a-f]{64})  mooncake_conversation\.jsonl\.gz, decompressed", text, flags=re.M)
    return digest


def test_shipped_mooncake_trace_is_the_published_file() -> None:
    """The decompressed copy's sha256 is the README's (the verbatim Mooncake file); its row count and mean
    lengths are the published ones: kvcache-ai/Mooncake FAST25-release README 12,031 requests, mean input
    12,035 and output 343 tokens; to one decimal 12,035.1 and 342.6 (shared/traces/README.md, summary table)."""
    raw = gzip.decompress(MOONCAKE.read_bytes())
    assert hashlib.sha256(raw).hexdigest() == _readme_sha256() \
        == "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"
    assert "mooncake_conversation" in shipped_traces()
    assert resolve_trace("mooncake_conversation") == resolve_trace("mooncake_conversation.jsonl.gz") == MOONCAKE
    df = read_trace("mooncake_conversation")
    assert len(df) == 12_031
    assert round(df["input_tokens"].mean(), 1) == 12_035.1 and round(df["output_tokens"].mean(), 1) == 342.6
    assert df["arrival_s"].iloc[0] == 0.0 and df["arrival_s"].iloc[-1] == pytest.approx(3536.999)
    assert df["arrival_s"].nunique() == 1_180                                      # the 3-s grid of the README
    sample = sample_lengths(EmpiricalLength(trace="mooncake_conversation", column="output"), 10, np.random.default_rng(0))
    assert set(sample.tolist()) <= set(df["output_tokens"].tolist())


def test_mooncake_replay_gives_the_trace_block_keys() -> None:
    """Replayed requests carry TraceBlockKeys whose keys follow the rule from the raw JSON lines (read here)."""
    rows = [json.loads(line) for line in gzip.decompress(MOONCAKE.read_bytes()).decode().splitlines()]
    cfg = TrafficConfig.model_validate({"arrival": {"process": "trace", "path": "mooncake_conversation",
                                                    "start_s": 30.0, "max_requests": 400}})
    s = build_requests(cfg, np.random.default_rng(0))
    assert isinstance(s.prefix_keys, TraceBlockKeys) and len(s.prefix_keys) == len(s) == 400
    first = next(i for i, row in enumerate(rows) if row["timestamp"] >= 30_000)
    for r in (0, 1, 57, 399):
        row = rows[first + r]
        assert s.prompt_tokens[r] == row["input_length"] and s.output_tokens[r] == row["output_length"]
        for bs in (16, 64, 100):
            expect = []
            for j in range(row["input_length"] // bs):
                end = (j + 1) * bs
                c = (end - 1) // 512
                if c < len(row["hash_ids"]):
                    expect.append(row["hash_ids"][c] * 513 + (end - c * 512))
            assert s.prefix_keys.block_keys(r, bs) == expect
    assert s.session is None and s.follows is None


def test_bad_jsonl_traces_are_one_line(tmp_path: Path) -> None:
    good = {"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}
    cases = {
        "notjson.jsonl": "{oops\n",
        "missing.jsonl": json.dumps({"timestamp": 0, "input_length": 1}) + "\n",
        "negative.jsonl": json.dumps({**good, "input_length": -4}) + "\n",
        "ids.jsonl": json.dumps({**good, "hash_ids": [1, "x"]}) + "\n",
        "time.jsonl": json.dumps({**good, "timestamp": "soon"}) + "\n",
        "empty.jsonl": "\n",
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(CapacityError) as e:
            read_trace(str(path))
        assert "\n" not in str(e.value) and str(path) in str(e.value), name
    path = tmp_path / "ok.jsonl.gz"
    path.write_bytes(gzip.compress((json.dumps(good) + "\n" + json.dumps({**good, "timestamp": 1500, "output_length": 0})
                                    + "\n").encode()))
    df = read_trace(str(path))
    assert len(df) == 1                                                            # the 0-output row is dropped


# ---------------------------------------------------------------------------------------------
# The contract, end to end through the simulator
# ---------------------------------------------------------------------------------------------


def test_the_simulator_sends_each_turn_after_the_previous_answer_plus_think_time() -> None:
    """A small run of the shipped multi-turn scenario: first turns arrive when the stream says, each later
    turn at its previous turn's finish + think_s (RequestStream's contract), and later turns find at least
    the class's system-prompt blocks (1,500 tokens: 93 blocks of 16) in the prefix cache."""
    from capacity.sim.simulate import run

    sc = load(shipped_scenario("sessions"), ["traffic.arrival.num_sessions=25", "speculative.method=none",
                                              "speculative.num_speculative_tokens=0"])
    stream = build_requests(sc.traffic, np.random.default_rng(np.random.SeedSequence(sc.simulation.seed).spawn(2)[0]))
    res = run(sc, stream=stream)
    df = res.requests.set_index("request_id").sort_index()
    assert len(df) == len(stream) and not df["rejected"].any()
    first = stream.follows < 0
    np.testing.assert_allclose(df["arrival_s"].to_numpy()[first], stream.arrival_s[first])
    later = np.flatnonzero(~first)
    expect = df["finish_s"].to_numpy()[stream.follows[later]] + stream.think_s[later]
    np.testing.assert_allclose(df["arrival_s"].to_numpy()[later], expect, rtol=1e-9)
    system_blocks = sc.traffic.classes[0].system_prompt_tokens // sc.engine.block_size
    assert np.all(df["cached_tokens"].to_numpy()[later] >= system_blocks * sc.engine.block_size)
    assert 0 < res.metrics["prefix_cache_hit_rate"] <= 1
