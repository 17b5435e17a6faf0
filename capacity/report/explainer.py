"""The interactive draft-and-verify view: what speculative decoding does in one picture.

Each verification round the drafter proposes N tokens; the target checks them in one forward pass and
keeps them left to right until the first rejection (accepted: green, the rejected one: red, the drafts
after it: grey, thrown away), then emits one token of its own (blue): the bonus token when every draft
was accepted, the correction that replaces the rejected draft otherwise. A round therefore writes
A + 1 tokens, and writing a reply of `TARGET_TOKENS` tokens takes fewer rounds (target passes) than
one token per pass.

The rounds are drawn in Python with the simulator's own acceptance model,
`capacity.spec.acceptance.IIDAcceptance(alpha)` (M0: every position accepted with probability alpha, stop at
the first rejection), for a grid of alpha (0.00, 0.05, ..., 1.00) × N (1..8) with one fixed seed; the same
seed for every grid cell means the same uniforms, so moving the alpha slider only ever adds accepted
tokens. The page embeds those samples as JSON and its script only switches between them; next to the
sampled mean over `SAMPLE_ROUNDS` rounds it shows the closed form E[tokens per round] =
(1 − alpha^(N+1)) / (1 − alpha).
"""

from __future__ import annotations

import html
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go

from capacity.spec.acceptance import IIDAcceptance
from capacity.report.figures import code_version
from capacity.report.page import page

ALPHAS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(21))
NS: tuple[int, ...] = tuple(range(1, 9))
TARGET_TOKENS = 32          # tokens of the reply the shown rounds write
SAMPLE_ROUNDS = 4000        # rounds behind each sampled mean
SEED = 0
DEFAULT_ALPHA = 0.8
DEFAULT_N = 4
HEIGHT = 640

# cell codes: 1 accepted draft, 2 rejected draft, 3 discarded draft (after a rejection), 4 target's token
COLOURS = {1: "#2ca02c", 2: "#d62728", 3: "#d0d0d0", 4: "#1f77b4"}
NAMES = {1: "accepted draft", 2: "rejected draft", 3: "discarded draft (after the rejection)",
         4: "target's token (bonus if all accepted, else the correction)"}
SYMBOLS = {1: "✓", 2: "✗", 3: "·", 4: "+"}
_COLORSCALE = [[0.0, COLOURS[1]], [0.25, COLOURS[1]], [0.25, COLOURS[2]], [0.5, COLOURS[2]],
               [0.5, COLOURS[3]], [0.75, COLOURS[3]], [0.75, COLOURS[4]], [1.0, COLOURS[4]]]
X_TITLE = "position in the round (drafted tokens d1…dN, then the target's own token +1)"
Y_TITLE = "verification round (one target forward pass each)"


def expected_tokens(alpha: float, n: int) -> float:
    """Closed form E[tokens per round] = (1 − α^(N+1)) / (1 − α) (N + 1 at α = 1)."""
    return float(n + 1) if alpha >= 1.0 else (1.0 - alpha ** (n + 1)) / (1.0 - alpha)


def sample_rounds(alpha: float, n: int, rounds: int = SAMPLE_ROUNDS, seed: int = SEED) -> np.ndarray:
    """Accepted drafts per round for `rounds` consecutive rounds of one request, drawn by the
    simulator's IIDAcceptance with a fixed seed."""
    rng = np.random.default_rng(seed)
    return IIDAcceptance(alpha).sample_steps(np.zeros(1, dtype=np.int64), n, rounds, rng)[:, 0]


def rounds_to_write(accepted: np.ndarray, tokens: int = TARGET_TOKENS) -> int:
    """How many of the rounds it takes to write `tokens` tokens (each round writes A + 1)."""
    return int(np.searchsorted(np.cumsum(np.asarray(accepted) + 1), tokens) + 1)


@lru_cache(maxsize=4)
def alpha_for(tokens_per_round: float, n: int) -> float:
    """The per-draft acceptance α whose closed form (1 − α^(N+1))/(1 − α) gives `tokens_per_round`
    (a run's tokens per verification round: 1 + its mean accepted drafts), by bisection; the
    view's starting point for a run or plan with speculation."""
    lo, hi = 0.0, 1.0
    target = min(max(tokens_per_round, 1.0), n + 1.0)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if expected_tokens(mid, n) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _data(seed: int = SEED) -> str:
    frames = []
    for alpha in ALPHAS:
        row = []
        for n in NS:
            acc = sample_rounds(alpha, n, SAMPLE_ROUNDS, seed)
            shown = acc[:rounds_to_write(acc)]
            row.append({"shown": [int(a) for a in shown], "sampled_mean": round(float(np.mean(acc + 1)), 5),
                        "expected": round(expected_tokens(alpha, n), 5)})
        frames.append(row)
    return json.dumps({"model": "capacity.spec.acceptance.IIDAcceptance", "seed": seed, "alphas": list(ALPHAS),
                       "ns": list(NS), "target_tokens": TARGET_TOKENS, "sample_rounds": SAMPLE_ROUNDS,
                       "frames": frames}, separators=(",", ":"))


def explainer_data(seed: int = SEED) -> dict[str, Any]:
    """The precomputed samples the page embeds: frames[alpha index][N − 1] = {shown: accepted drafts of
    the rounds that write TARGET_TOKENS tokens, sampled_mean: mean tokens per round over
    SAMPLE_ROUNDS rounds, expected: the closed form}."""
    return json.loads(_data(seed))


def _grid(shown: list[int], n: int) -> tuple[list, list, list, list]:
    z, text, hover, ylab = [], [], [], []
    for r, a in enumerate(shown):
        row = [1 if j <= a else 2 if j == a + 1 else 3 for j in range(1, n + 1)] + [4]
        z.append(row)
        text.append([SYMBOLS[c] for c in row])
        h = [f"round {r + 1}, draft {j}: {NAMES[c]}" for j, c in enumerate(row[:-1], start=1)]
        h.append(f"round {r + 1}: " + ("bonus token (every draft accepted)" if a == n
                                       else f"correction token from the target (replaces draft {a + 1})"))
        hover.append(h)
        ylab.append(f"round {r + 1} (+{a + 1})")
    return z, text, hover, ylab


def _titles(alpha: float, n: int, frame: dict, source: str) -> tuple[str, str]:
    rounds = len(frame["shown"])
    title = (f"Draft and verify, α = {alpha:.2f}, N = {n}: {rounds} rounds write {TARGET_TOKENS} tokens "
             f"(one token per pass would take {TARGET_TOKENS})")
    sub = (f"mean tokens per round: sampled {frame['sampled_mean']:.3f} over {SAMPLE_ROUNDS} rounds, closed form "
           f"(1 − α^(N+1))/(1 − α) = {frame['expected']:.3f} · IIDAcceptance, seed {SEED}"
           + f" · {source or code_version()}")
    return title, sub


def explainer_figure(alpha: float = DEFAULT_ALPHA, n: int = DEFAULT_N, *, source: str = "") -> go.Figure:
    """One frame of the view as a static figure (for notebooks and PNG export)."""
    data = explainer_data()
    ai = int(np.argmin(np.abs(np.array(ALPHAS) - alpha)))
    if n not in NS:
        raise ValueError(f"N must be in {NS[0]}..{NS[-1]}")
    frame = data["frames"][ai][n - 1]
    z, text, hover, ylab = _grid(frame["shown"], n)
    xlab = [f"d{j}" for j in range(1, n + 1)] + ["+1"]
    fig = go.Figure(go.Heatmap(z=z, x=xlab, y=ylab, text=text, texttemplate="%{text}", customdata=hover,
                               hovertemplate="%{customdata}<extra></extra>", colorscale=_COLORSCALE, zmin=0.5,
                               zmax=4.5, showscale=False, xgap=2, ygap=2))
    for c in (1, 2, 3, 4):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=NAMES[c],
                                 marker={"symbol": "square", "size": 12, "color": COLOURS[c]}))
    title, sub = _titles(ALPHAS[ai], n, frame, source)
    fig.update_layout(title={"text": title, "subtitle": {"text": sub}, "x": 0.01, "xanchor": "left"},
                      template="plotly_white", height=HEIGHT, margin={"t": 90, "l": 110, "r": 30, "b": 60},
                      xaxis={"title": {"text": X_TITLE}, "type": "category"},
                      yaxis={"title": {"text": Y_TITLE}, "autorange": "reversed", "type": "category"},
                      legend={"orientation": "h", "y": -0.12})
    return fig


_SCRIPT = r"""
(function () {
  var id = %(id)s, source = %(source)s;
  var data = JSON.parse(document.getElementById(id + "-data").textContent);
  var aIn = document.getElementById(id + "-alpha"), nIn = document.getElementById(id + "-n");
  var aOut = document.getElementById(id + "-alpha-value"), nOut = document.getElementById(id + "-n-value");
  var stats = document.getElementById(id + "-stats"), div = document.getElementById(id);
  var COLOURS = %(colours)s, NAMES = %(names)s, SYMBOLS = %(symbols)s, SCALE = %(scale)s;
  function grid(shown, n) {
    var z = [], text = [], hover = [], ylab = [];
    for (var r = 0; r < shown.length; r++) {
      var a = shown[r], row = [], t = [], h = [];
      for (var j = 1; j <= n; j++) {
        var c = j <= a ? 1 : (j === a + 1 ? 2 : 3);
        row.push(c); t.push(SYMBOLS[c]); h.push("round " + (r + 1) + ", draft " + j + ": " + NAMES[c]);
      }
      row.push(4); t.push(SYMBOLS[4]);
      h.push("round " + (r + 1) + ": " + (a === n ? "bonus token (every draft accepted)"
             : "correction token from the target (replaces draft " + (a + 1) + ")"));
      z.push(row); text.push(t); hover.push(h); ylab.push("round " + (r + 1) + " (+" + (a + 1) + ")");
    }
    return {z: z, text: text, hover: hover, ylab: ylab};
  }
  var playBtn = document.getElementById(id + "-play"), backBtn = document.getElementById(id + "-back"),
      stepBtn = document.getElementById(id + "-step"), timer = null, upto = null;  // rounds shown (null: all)
  function frame() { return data.frames[+aIn.value][+nIn.value - 1]; }
  function stop() { if (timer) { clearInterval(timer); timer = null; } playBtn.textContent = "\u25b6 play"; }
  function step(d) {
    var total = frame().shown.length, k = upto === null ? total : upto;
    k = Math.max(1, Math.min(total, k + d));
    upto = k >= total ? null : k;
    draw();
    return upto !== null;
  }
  playBtn.addEventListener("click", function () {
    if (timer) { stop(); return; }
    upto = upto === null ? 0 : upto;
    playBtn.textContent = "\u275a\u275a pause";
    timer = setInterval(function () { if (!step(1)) stop(); }, 600);
  });
  stepBtn.addEventListener("click", function () { stop(); if (upto !== null) step(1); });
  backBtn.addEventListener("click", function () { stop(); step(-1); });
  function draw() {
    var ai = +aIn.value, n = +nIn.value, alpha = data.alphas[ai], f = data.frames[ai][n - 1];
    var shown = upto === null ? f.shown : f.shown.slice(0, upto);
    var g = grid(shown, n), xlab = [], written = 0, rounds = shown.length;
    for (var j = 1; j <= n; j++) xlab.push("d" + j);
    xlab.push("+1");
    for (var r = 0; r < rounds; r++) written += shown[r] + 1;
    aOut.textContent = alpha.toFixed(2); nOut.textContent = n;
    stats.innerHTML = (upto === null ? "" : "round <b>" + rounds + "</b> of " + f.shown.length + ": <b>" + written +
      "</b> tokens written so far &middot; ") + "rounds used: <b>" + f.shown.length + "</b> to write " + data.target_tokens + " tokens (" +
      data.target_tokens + " without speculation) &middot; mean tokens per round: these rounds <b>" +
      (written / rounds).toFixed(2) + "</b>, sampled over " + data.sample_rounds + " rounds <b>" +
      f.sampled_mean.toFixed(3) + "</b>, closed form (1 &minus; &alpha;<sup>N+1</sup>)/(1 &minus; &alpha;) = <b>" +
      f.expected.toFixed(3) + "</b>";
    var traces = [{type: "heatmap", z: g.z, x: xlab, y: g.ylab, text: g.text, texttemplate: "%%{text}",
      customdata: g.hover, hovertemplate: "%%{customdata}<extra></extra>", colorscale: SCALE, zmin: 0.5,
      zmax: 4.5, showscale: false, xgap: 2, ygap: 2}];
    [1, 2, 3, 4].forEach(function (c) {
      traces.push({type: "scatter", x: [null], y: [null], mode: "markers", name: NAMES[c],
        marker: {symbol: "square", size: 12, color: COLOURS[c]}});
    });
    var title = "Draft and verify, \u03b1 = " + alpha.toFixed(2) + ", N = " + n + ": " + f.shown.length + " rounds write " +
      data.target_tokens + " tokens (one token per pass would take " + data.target_tokens + ")";
    var sub = "mean tokens per round: sampled " + f.sampled_mean.toFixed(3) + " over " + data.sample_rounds +
      " rounds, closed form (1 \u2212 \u03b1^(N+1))/(1 \u2212 \u03b1) = " + f.expected.toFixed(3) +
      " \u00b7 IIDAcceptance, seed " + data.seed + (source ? " \u00b7 " + source : "");
    var layout = {title: {text: title, subtitle: {text: sub}, x: 0.01, xanchor: "left"}, template: %(template)s,
      height: %(height)d, margin: {t: 90, l: 110, r: 30, b: 60},
      xaxis: {title: {text: %(xtitle)s}, type: "category"},
      yaxis: {title: {text: %(ytitle)s}, autorange: "reversed", type: "category"},
      legend: {orientation: "h", y: -0.12}};
    Plotly.react(div, traces, layout, {responsive: true, displaylogo: false});
  }
  aIn.addEventListener("input", function () { stop(); upto = null; draw(); });
  nIn.addEventListener("input", function () { stop(); upto = null; draw(); });
  draw();
})();
"""


def _js(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False).replace("</", "<\\/")


def explainer_section(source: str = "", div_id: str = "explainer", alpha: float | None = None,
                      n: int | None = None, basis: str = "") -> str:
    """HTML fragment (controls, play / step buttons, plot div, embedded samples, script) for a page
    that loads plotly.js; it opens at (alpha, n) — a report passes its run's N and the α matching
    its tokens per round, saying so in `basis` — else at the defaults."""
    # plotly.io and plotly.utils add ~0.1 s to the import of plotly.graph_objects: only a written page needs them
    import plotly.io as pio
    from plotly.utils import PlotlyJSONEncoder

    alpha = DEFAULT_ALPHA if alpha is None else alpha
    n = DEFAULT_N if n is None else max(NS[0], min(NS[-1], int(n)))
    ai = int(np.argmin(np.abs(np.array(ALPHAS) - alpha)))
    template = pio.templates["plotly_white"].to_plotly_json()
    script = _SCRIPT % {
        "id": _js(div_id), "source": _js(source), "colours": _js(COLOURS), "names": _js(NAMES),
        "symbols": _js(SYMBOLS), "scale": _js(_COLORSCALE), "template": json.dumps(template, cls=PlotlyJSONEncoder).replace("</", "<\\/"), "height": HEIGHT,
        "xtitle": _js(X_TITLE), "ytitle": _js(Y_TITLE),
    }
    esc = html.escape
    payload = _data().replace("</", "<\\/")
    return f"""<section class="explainer" id="{esc(div_id)}-section">
<h2>Draft and verify: how speculative decoding writes several tokens per target pass</h2>
<p>Each round the drafter proposes <i>N</i> tokens; the target model checks all of them in one forward pass
and keeps them left to right until the first rejection. Accepted drafts are <span style="color:{COLOURS[1]}">green</span>,
the rejected one <span style="color:{COLOURS[2]}">red</span>, drafts after it are thrown away (grey); the target
always adds one token of its own (<span style="color:{COLOURS[4]}">blue</span>): the bonus token when every draft
was accepted, the correction otherwise. The rounds below are sampled with the simulator's acceptance model
(<code>IIDAcceptance</code>: each draft accepted with probability &alpha;) and a fixed seed.</p>
<div class="controls">
<label>acceptance probability &alpha; = <output id="{esc(div_id)}-alpha-value">{ALPHAS[ai]:.2f}</output>
<input type="range" id="{esc(div_id)}-alpha" min="0" max="{len(ALPHAS) - 1}" step="1" value="{ai}"></label>
<label>drafted tokens per round N = <output id="{esc(div_id)}-n-value">{n}</output>
<input type="range" id="{esc(div_id)}-n" min="{NS[0]}" max="{NS[-1]}" step="1" value="{n}"></label>
<button type="button" id="{esc(div_id)}-back">&#9664; back</button>
<button type="button" id="{esc(div_id)}-play">&#9654; play</button>
<button type="button" id="{esc(div_id)}-step">step &#9654;</button>
</div>
{f'<p class="basis">{esc(basis)}</p>' if basis else ''}
<p class="stats" id="{esc(div_id)}-stats"></p>
<div id="{esc(div_id)}" class="plotly-graph-div figure-div" style="height:{HEIGHT}px; width:100%;"></div>
<script type="application/json" id="{esc(div_id)}-data">{payload}</script>
<script type="text/javascript">{script}</script>
</section>"""


def explainer_page(source: str = "") -> str:
    """A self-contained page with the view alone (plotly.js inline once)."""
    return page("Draft and verify (speculative decoding)", [explainer_section(source)],
                header="<h1>Draft and verify</h1><p>The acceptance model of the capacity simulator, "
                       f"sampled. {html.escape(source)}</p>")


def write_explainer(path: str | Path, source: str = "") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(explainer_page(source or code_version()), encoding="utf-8")
    return path
