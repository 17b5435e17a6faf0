"""Re-price recorded schedules (record.py) under target-side hypotheses for speculative steps.

Keys of the hypothesis dict h (all per speculative step, added to the target forward):
rho (correlated routing exponent), kappa_kv / kappa_kvq (KV re-read x decode KV time, per step /
per query token), mtile (query tile of a prefill-style kernel), fix_ms / seq_us / layer_us (fixed
cost per step / sequence / layer), seq_us_v1 + seq_us_v2 (per sequence, split by vLLM model runner
as in the article's serve flags), gdn / gdn_snap (Gated DeltaNet state bytes per verified token /
per draft, as a multiple of one state write at the efficiency-scaled HBM bandwidth), fixT_<target>
(diagnostic only: a per-target fixed cost, not a model).
"""
import pickle, math
import numpy as np, pandas as pd
from capacity.inputs.hardware import load_gpu
from capacity.inputs.models import load_model
from capacity.cost.step_cost import StepCostModel, StepFeatures, expected_distinct_experts
from capacity.fidelity import speedups as v

from pathlib import Path
D = pickle.load(open(Path(__file__).resolve().parent / "rec_ppu4.pkl", "rb"))
rows = D["rows"]
CM = {}
for t, ld in D["loads"].items():
    dep = ld.deployment
    m = load_model(dep.target, weight_precision=dep.precision)
    CM[t] = StepCostModel(load_gpu(dep.gpu), m, dep.tp, verify_routing_exponent=1.0,
                          state_snapshot_write_efficiency=math.inf)

def step_times(cm, F, spec_mask, h):
    """Target time per step with hypothesis params h (dict)."""
    f = StepFeatures(*(F[:, i] for i in range(5)))
    eff = dict(cm.efficiency)
    parts = cm.time_parts(f, eff)
    m, tp = cm.model, cm.tp
    tok, seqs, samp, af, kv = (F[:, i] for i in range(5))
    decode = np.isclose(samp, tok) & (seqs > 0)
    q = np.where(seqs > 0, tok / np.maximum(seqs, 1), 1.0)
    bw = cm.gpu.hbm_bandwidth_tb_s * 1e12 * eff["hbm"]
    t = sum(np.asarray(p, float) for p in parts.values())
    rho = h.get("rho", 1.0)
    if rho != 1.0 and m.num_moe_layers:
        n_eff = np.where(decode, seqs * q ** rho, tok)
        experts = expected_distinct_experts(m.num_experts, m.experts_per_token, n_eff)
        new = np.maximum(m.expert_flops_per_token * tok / (tp * cm._peak_expert * eff["gemm"] * eff[cm.moe_efficiency_key]),
                         m.num_moe_layers * experts * m.expert_weight_bytes / (tp * bw * eff[cm.moe_efficiency_key]))
        t = t - parts["moe_gemm"] + new
    sp = spec_mask
    extra = np.zeros_like(t)
    # b1: verification re-reads KV at an extra cost kappa x decode KV time
    if h.get("kappa_kv"):
        kvt = (kv - m.state_bytes_per_seq * seqs) / (cm._kv_split * bw)
        extra += h["kappa_kv"] * kvt
    # b1b: per query token (1+N) KV re-read
    if h.get("kappa_kvq"):
        kvt = (kv - m.state_bytes_per_seq * seqs) / (cm._kv_split * bw)
        extra += h["kappa_kvq"] * kvt * q
    # b2: query padded to M tile, at attention efficiency
    if h.get("mtile"):
        M = h["mtile"]
        lin = m.linear_attn_flops_per_token * tok
        ctxflops = np.maximum(af - lin, 0)
        padded = ctxflops * np.maximum(M / np.maximum(q, 1), 1.0)
        a_old = np.maximum(af / (tp * cm._peak_attn * eff["attention"]), kv / (cm._kv_split * bw))
        a_new = np.maximum((padded + lin) / (tp * cm._peak_attn * eff["attention"]), kv / (cm._kv_split * bw))
        extra += a_new - a_old
    # c: fixed per spec step
    extra += h.get("fix_ms", 0) * 1e-3 + h.get("seq_us", 0) * 1e-6 * seqs + h.get("layer_us", 0) * 1e-6 * m.num_layers
    extra += h.get("fixT_" + m.name, 0) * 1e-3 + h.get("seqT_" + m.name, 0) * 1e-6 * seqs
    V2 = ("google/gemma-4-26B-A4B-it", "Qwen/Qwen3.6-27B")
    if "seq_us_v2" in h:
        extra += (h["seq_us_v2"] if m.name in V2 else h.get("seq_us_v1", 0)) * 1e-6 * seqs
    # d: GDN state per verified token per linear layer
    if h.get("gdn") and m.num_linear_attention_layers:
        extra += h["gdn"] * m.state_bytes_per_seq * tok / (tp * bw)
    if h.get("gdn_snap") and m.num_linear_attention_layers:
        extra += h["gdn_snap"] * m.state_bytes_per_seq * np.maximum(tok - seqs, 0) / (tp * bw)
    t = t + extra * sp
    return t

def prep():
    out = []
    for i, r in rows.iterrows():
        rec = D["spec"][i]
        cm = CM[r["target"]]
        F = rec["features"]; ds = rec["draft_s"]
        sp = ds > 0
        t0 = step_times(cm, F, sp, {})
        meth = r["method_name"]; n = int(r["num_speculative_tokens"])
        out.append(dict(i=i, cm=cm, F=F, sp=sp, t0sum=t0.sum(), dur=rec["duration"], outtok=rec["out"],
                        K=sp.sum() * v.overhead_units(meth, n), ov0=v.default_overhead_us(meth)))
    return out
P = prep()
BASE = {t: D["base"][t]["tput"] for t in D["loads"]}
meas = rows["speedup"].to_numpy(float)
methods = rows["method_name"].to_numpy()
targets = rows["target"].to_numpy()

def predict(h, ov=None):
    pr = np.empty(len(P))
    for k, p in enumerate(P):
        T = p["dur"] + step_times(p["cm"], p["F"], p["sp"], h).sum() - p["t0sum"]
        m = methods[k]
        if ov is not None and m in ov:
            T += p["K"] * (ov[m] - p["ov0"]) * 1e-6
        pr[k] = p["outtok"] / T / BASE[targets[k]]
    return pr

def summary(pred, mask=None, label=""):
    mask = np.ones(len(pred), bool) if mask is None else mask
    e = np.abs(pred - meas)[mask] / meas[mask]
    df = rows.assign(pred=pred, pred_tok=pred * rows.baseline_output_tok_s)
    reg = v.best_n_regret(df[mask], pred="pred_tok")
    return f"{label} median {np.median(e):.1%} p90 {np.quantile(e, .9):.1%} bias {np.mean((pred-meas)[mask]/meas[mask]):+.1%} regret {reg.regret.mean():.1%}"

def by(pred, key):
    e = np.abs(pred - meas) / meas
    return pd.DataFrame({"k": rows[key], "e": e, "s": (pred - meas) / meas}).groupby("k").agg(median=("e", "median"), p90=("e", lambda x: x.quantile(.9)), bias=("s", "mean"))
