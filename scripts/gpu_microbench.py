"""Microbenchmarks of one GPU for its hardware profile: GEMM rate against token count, HBM bandwidth,
attention against context, and the fixed time per kernel. Needs PyTorch with a CUDA or ROCm device;
the project never imports it (nothing depends on it at run or test time).

Each case is timed as CUDA-graph replays of a sequence of calls on distinct buffers, enough of them
that the data of one sequence is several times the L2 cache, so small cases stream from HBM as they
would inside a model's forward pass and launch overhead is the graph's, as in vLLM's decode steps.
The median over replays is written per case to one CSV row (`kind, dtype, m, n, k, batch, context,
heads, us_per_call, tflops, tb_s, note`), which `capacity/data/measurements/gpu_microbench.csv`
keeps with the machine it ran on.

    python scripts/gpu_microbench.py --out OUT_DIR            # the whole set (about 2-3 min on an H200)
    python scripts/gpu_microbench.py --out OUT_DIR --quick --device cpu   # the logic, tiny sizes, no graphs
    python scripts/gpu_microbench.py --out OUT_DIR --sections moe,verify_attention   # some sections only

The sections moe, decode_attention_packed, verify_attention and gemm_steps were added after the H200 run of
2026-12-04 (capacity/data/measurements/gpu_microbench_h200.csv) and have run only in --quick mode on a CPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

L2_FLUSH_BYTES = 512 * 2**20     # data per timed sequence: several times an H200's 60 MB (MI300X: 256 MB LLC)
MAX_COPIES = 256
FIELDS = ("kind", "dtype", "m", "n", "k", "batch", "context", "heads", "us_per_call", "tflops", "tb_s", "note")

# (model, projection, N, K) of TP1 linear layers as vLLM fuses them (QKV, gate_up merged)
LLAMA_8B = (("llama-3.1-8b", "qkv", 6144, 4096), ("llama-3.1-8b", "o", 4096, 4096),
            ("llama-3.1-8b", "gate_up", 28672, 4096), ("llama-3.1-8b", "down", 4096, 14336),
            ("llama-3.1-8b", "lm_head", 128256, 4096))
LLAMA_70B = (("llama-3.3-70b", "qkv", 10240, 8192), ("llama-3.3-70b", "o", 8192, 8192),
             ("llama-3.3-70b", "gate_up", 57344, 8192), ("llama-3.3-70b", "down", 8192, 28672))
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class Timer:
    def __init__(self, device: str, reps: int, warmup: int):
        self.device, self.reps, self.warmup = device, reps, warmup

    def per_call_us(self, calls: list) -> float:
        """Median time of one call of `calls` (each a zero-argument callable), over replays of all."""
        if self.device == "cpu":
            for f in calls:
                f()
            times = []
            for _ in range(self.reps):
                t0 = time.perf_counter()
                for f in calls:
                    f()
                times.append(time.perf_counter() - t0)
            return statistics.median(times) * 1e6 / len(calls)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for f in calls:                       # warm-up outside the graph (library handles, autotuning)
                f()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for f in calls:
                f()
        for _ in range(self.warmup):
            graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(self.reps):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        del graph
        return statistics.median(times) * 1e3 / len(calls)


def copies_for(nbytes: int, flush: int) -> int:
    return max(2, min(MAX_COPIES, math.ceil(flush / max(nbytes, 1))))


def row(**kw) -> dict:
    r = {k: "" for k in FIELDS}
    r.update({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in kw.items()})
    return r


def gemm_cases(timer: Timer, device: str, shapes, dtype: str, tokens, flush: int):
    """y = x W^T (vLLM's linear layers) for each (N, K) and token count M; fp8: torch._scaled_mm with
    per-tensor scales (the FP8 checkpoints' W8A8 path)."""
    for model, proj, n, k in shapes:
        w_bytes = n * k * (1 if dtype == "fp8" else 2)
        copies = copies_for(w_bytes, flush)
        if dtype == "fp8":
            ws = [torch.randn(n, k, device=device).to(torch.float8_e4m3fn) for _ in range(copies)]
            scale = torch.ones((), device=device, dtype=torch.float32)
        else:
            ws = [torch.randn(n, k, device=device, dtype=torch.bfloat16) for _ in range(copies)]
        for m in tokens:
            try:
                if dtype == "fp8":
                    x = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
                    calls = [lambda w=w: torch._scaled_mm(x, w.t(), scale_a=scale, scale_b=scale,
                                                         out_dtype=torch.bfloat16) for w in ws]
                else:
                    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                    y = torch.empty(m, n, device=device, dtype=torch.bfloat16)
                    calls = [lambda w=w: torch.matmul(x, w.t(), out=y) for w in ws]
                us = timer.per_call_us(calls)
                moved = w_bytes + m * k * (1 if dtype == "fp8" else 2) + m * n * 2
                yield row(kind="gemm", dtype=dtype, m=m, n=n, k=k, us_per_call=us,
                          tflops=2.0 * m * n * k / us / 1e6, tb_s=moved / us / 1e6, note=f"{model} {proj}")
            except Exception as exc:    # noqa: BLE001 - a shape the library refuses is recorded, not fatal
                yield row(kind="gemm", dtype=dtype, m=m, n=n, k=k, note=f"{model} {proj} failed: {exc!s:.80}")
        del ws
        if device != "cpu":
            torch.cuda.empty_cache()


def square_gemms(timer: Timer, device: str, sizes, dtype: str):
    for s in sizes:
        yield from gemm_cases(timer, device, (("square", f"{s}^3", s, s),), dtype, (s,), flush=0)


def hbm_cases(timer: Timer, device: str, sizes_mib):
    for mib in sizes_mib:
        nbytes = mib * 2**20
        a = torch.empty(nbytes // 2, device=device, dtype=torch.bfloat16).normal_()
        b = torch.empty_like(a)
        acc = torch.empty((), device=device, dtype=torch.float32)
        for kind, calls, moved in (
                ("hbm_copy", [lambda: b.copy_(a)], 2 * nbytes),
                ("hbm_read", [lambda: torch.sum(a, 0, dtype=torch.float32, out=acc)], nbytes),
                ("hbm_write", [lambda: b.fill_(1.0)], nbytes)):
            us = timer.per_call_us(calls * 4)
            yield row(kind=kind, dtype="bf16", m=nbytes, us_per_call=us, tb_s=moved / us / 1e6,
                      note=f"{mib} MiB buffer")
        del a, b


def sdpa(q, k, v, causal: bool, gqa: bool, backend=None):
    if backend is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def pick_backend(q, k, v, causal: bool):
    """The first of FlashAttention, memory-efficient, cuDNN that takes these shapes (GQA heads)."""
    for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        try:
            sdpa(q, k, v, causal, True, b)
            return b
        except RuntimeError:
            continue
    raise RuntimeError("no fused SDPA backend takes these shapes")


def kv_caches(device: str, batches, contexts, kv_heads: int, head_dim: int, max_kv_bytes: int, flush: int):
    """(batch, context, KV bytes, [(K, V) copies]) for every batch x context whose KV fits `max_kv_bytes`;
    enough copies that one sequence of calls streams `flush` bytes. Freed after each case."""
    for b in batches:
        for c in contexts:
            kv_bytes = 2 * b * kv_heads * c * head_dim * 2
            if kv_bytes > max_kv_bytes:
                continue
            kvs = [(torch.randn(b, kv_heads, c, head_dim, device=device, dtype=torch.bfloat16),
                    torch.randn(b, kv_heads, c, head_dim, device=device, dtype=torch.bfloat16))
                   for _ in range(copies_for(kv_bytes, flush))]
            try:
                yield b, c, kv_bytes, kvs
            finally:
                del kvs
                if device != "cpu":
                    torch.cuda.empty_cache()


def decode_attention_cases(timer: Timer, device: str, batches, contexts, q_heads=64, kv_heads=8, head_dim=128,
                           max_kv_bytes=8 * 2**30, flush=L2_FLUSH_BYTES):
    """One query token per sequence against a context of KV (contiguous, not paged: torch's SDPA), the
    heads of Llama-3.3-70B at TP1 (64 query, 8 KV heads of 128)."""
    for b, c, kv_bytes, kvs in kv_caches(device, batches, contexts, kv_heads, head_dim, max_kv_bytes, flush):
        try:
            q = torch.randn(b, q_heads, 1, head_dim, device=device, dtype=torch.bfloat16)
            be = pick_backend(q, *kvs[0], False)
            calls = [lambda kk=kk, vv=vv: sdpa(q, kk, vv, False, True, be) for kk, vv in kvs]
            us = timer.per_call_us(calls)
            flops = 4.0 * b * q_heads * c * head_dim
            yield row(kind="decode_attention", dtype="bf16", batch=b, context=c, heads=f"{q_heads}/{kv_heads}",
                      us_per_call=us, tflops=flops / us / 1e6, tb_s=kv_bytes / us / 1e6,
                      note=f"torch SDPA {be.name}, contiguous KV")
        except Exception as exc:    # noqa: BLE001
            yield row(kind="decode_attention", batch=b, context=c, note=f"failed: {exc!s:.80}")


def packed_decode_attention_cases(timer: Timer, device: str, batches, contexts, queries=(1,), group=8, kv_heads=8,
                                  head_dim=128, max_kv_bytes=8 * 2**30, flush=L2_FLUSH_BYTES):
    """Decode and verification attention with the GQA group packed into the query rows (what FlashAttention-3's
    pack_gqa and FlashInfer's decode do): each KV head meets `group` x `q` query rows of its sequence, as a
    non-causal SDPA of (batch, kv_heads, group x q, head_dim) against (batch, kv_heads, context, head_dim).
    q = 1 is decode; q = 1 + N is a verification step of N drafts (the causal mask among the N is ignored)."""
    for b, c, kv_bytes, kvs in kv_caches(device, batches, contexts, kv_heads, head_dim, max_kv_bytes, flush):
        for q_len in queries:
            try:
                q = torch.randn(b, kv_heads, group * q_len, head_dim, device=device, dtype=torch.bfloat16)
                be = pick_backend(q, *kvs[0], False)
                calls = [lambda kk=kk, vv=vv: sdpa(q, kk, vv, False, False, be) for kk, vv in kvs]
                us = timer.per_call_us(calls)
                flops = 4.0 * b * kv_heads * group * q_len * c * head_dim
                yield row(kind="decode_attention_packed", dtype="bf16", m=q_len, batch=b, context=c,
                          heads=f"{group * kv_heads}/{kv_heads}", us_per_call=us, tflops=flops / us / 1e6,
                          tb_s=kv_bytes / us / 1e6, note=f"torch SDPA {be.name}, GQA packed, m = query tokens per sequence")
            except Exception as exc:    # noqa: BLE001
                yield row(kind="decode_attention_packed", m=q_len, batch=b, context=c, note=f"failed: {exc!s:.80}")


def prefill_attention_cases(timer: Timer, device: str, lengths, q_heads=32, kv_heads=8, head_dim=128):
    """Causal self-attention of one prompt (heads of Llama-3.1-8B), FLOPs counted as the causal half."""
    for s in lengths:
        try:
            q = torch.randn(1, q_heads, s, head_dim, device=device, dtype=torch.bfloat16)
            k = torch.randn(1, kv_heads, s, head_dim, device=device, dtype=torch.bfloat16)
            v = torch.randn(1, kv_heads, s, head_dim, device=device, dtype=torch.bfloat16)
            be = pick_backend(q, k, v, True)
            us = timer.per_call_us([lambda: sdpa(q, k, v, True, True, be)] * 3)
            flops = 4.0 * q_heads * s * s * head_dim / 2
            yield row(kind="prefill_attention", dtype="bf16", batch=1, context=s, heads=f"{q_heads}/{kv_heads}",
                      us_per_call=us, tflops=flops / us / 1e6, note=f"torch SDPA {be.name} causal")
        except Exception as exc:    # noqa: BLE001
            yield row(kind="prefill_attention", context=s, note=f"failed: {exc!s:.80}")


def kernel_cases(timer: Timer, device: str):
    """Fixed time per kernel: back-to-back tiny element-wise kernels inside one graph, and launched
    eagerly from Python (what a step outside CUDA graphs pays)."""
    x = torch.zeros(1024, device=device, dtype=torch.float32)
    n = 1000
    us = timer.per_call_us([lambda: x.add_(1.0)] * n)
    yield row(kind="kernel_graph", dtype="fp32", m=1024, us_per_call=us, note=f"{n} x add_ in one graph")
    if device != "cpu":
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1.0)
        torch.cuda.synchronize()
        yield row(kind="kernel_eager", dtype="fp32", m=1024, us_per_call=(time.perf_counter() - t0) * 1e6 / n,
                  note=f"{n} x add_ launched from Python")


def decoder_layer_cases(timer: Timer, device: str, batches, context=1024, layers=32,
                        shape=(4096, 14336, 32, 8, 128)):
    """Decode steps of Llama-3.1-8B-shaped decoder layers (bf16, random weights, torch ops: RMSNorm,
    fused QKV, SDPA over `context` tokens, o_proj, residual, RMSNorm, fused gate_up, SiLU x mul, down):
    time per layer, to set against its weight and KV bytes at the measured copy bandwidth."""
    hidden, inter, qh, kvh, hd = shape

    def make():
        return dict(qkv=torch.randn((qh + 2 * kvh) * hd, hidden, device=device, dtype=torch.bfloat16) * 0.01,
                    o=torch.randn(hidden, qh * hd, device=device, dtype=torch.bfloat16) * 0.01,
                    gu=torch.randn(2 * inter, hidden, device=device, dtype=torch.bfloat16) * 0.01,
                    down=torch.randn(hidden, inter, device=device, dtype=torch.bfloat16) * 0.01,
                    n1=torch.ones(hidden, device=device, dtype=torch.bfloat16),
                    n2=torch.ones(hidden, device=device, dtype=torch.bfloat16))

    weights = [make() for _ in range(layers)]
    for b in batches:
        try:
            caches = [(torch.randn(b, kvh, context, hd, device=device, dtype=torch.bfloat16),
                       torch.randn(b, kvh, context, hd, device=device, dtype=torch.bfloat16)) for _ in range(layers)]
            x = torch.randn(b, hidden, device=device, dtype=torch.bfloat16)
            be = pick_backend(torch.randn(b, qh, 1, hd, device=device, dtype=torch.bfloat16), *caches[0], False)

            def rms(t, w):
                return t * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(t.dtype) * w

            def layer(w, kv):
                h = rms(x, w["n1"])
                qkv = F.linear(h, w["qkv"])
                q = qkv[:, :qh * hd].view(b, qh, 1, hd)
                a = sdpa(q, kv[0], kv[1], False, True, be).reshape(b, qh * hd)
                x2 = x + F.linear(a, w["o"])
                gu = F.linear(rms(x2, w["n2"]), w["gu"])
                x.copy_(x2 + F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], w["down"]))

            calls = [lambda w=w, kv=kv: layer(w, kv) for w, kv in zip(weights, caches)]
            us = timer.per_call_us(calls)
            w_bytes = sum(t.numel() * 2 for t in weights[0].values())
            kv_bytes = 2 * b * kvh * context * hd * 2
            yield row(kind="decoder_layer", dtype="bf16", batch=b, context=context, heads=f"{qh}/{kvh}",
                      us_per_call=us, tb_s=(w_bytes + kv_bytes) / us / 1e6,
                      note=f"llama-3.1-8b layer, torch ops, {layers} layers per graph")
        except Exception as exc:    # noqa: BLE001
            yield row(kind="decoder_layer", batch=b, note=f"failed: {exc!s:.80}")
        finally:
            caches = None
            if device != "cpu":
                torch.cuda.empty_cache()


# (model, experts, experts per token, hidden, expert intermediate) of routed-expert layers, TP1
MOE_SHAPES = (("gpt-oss-120b", 128, 4, 2880, 2880), ("MiniMax-M2.5", 256, 8, 3072, 1536))


def moe_cases(timer: Timer, device: str, shapes, tokens, flush=L2_FLUSH_BYTES, seed=0):
    """The two grouped GEMMs of a routed-expert layer (w13: hidden -> 2 x intermediate, w2: intermediate ->
    hidden; torch._grouped_mm, bf16) for `tokens` tokens routed uniformly at random to `experts per token`
    distinct experts, as FusedMoE sorts them by expert. Bytes: the weights of the experts touched."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for model, experts, top_k, hidden, inter in shapes:
        for name, n_out, k_in in (("w13", 2 * inter, hidden), ("w2", hidden, inter)):
            expert_bytes = n_out * k_in * 2
            copies = copies_for(experts * expert_bytes, flush)
            ws = [torch.randn(experts, n_out, k_in, device=device, dtype=torch.bfloat16).transpose(-2, -1)
                  for _ in range(copies)]
            for t in tokens:
                try:
                    choice = torch.rand(t, experts, generator=gen).topk(top_k, dim=1).indices.flatten()
                    counts = torch.bincount(choice, minlength=experts)
                    offs = torch.cumsum(counts, 0).to(torch.int32).to(device)
                    touched = int((counts > 0).sum())
                    a = torch.randn(t * top_k, k_in, device=device, dtype=torch.bfloat16)
                    calls = [lambda w=w: torch._grouped_mm(a, w, offs=offs) for w in ws]
                    us = timer.per_call_us(calls)
                    moved = touched * expert_bytes + t * top_k * (k_in + n_out) * 2
                    yield row(kind="moe_grouped_gemm", dtype="bf16", m=t, n=n_out, k=k_in, batch=touched,
                              heads=f"{experts}/{top_k}", us_per_call=us,
                              tflops=2.0 * t * top_k * n_out * k_in / us / 1e6, tb_s=moved / us / 1e6,
                              note=f"{model} {name}; batch = experts touched")
                except Exception as exc:    # noqa: BLE001
                    yield row(kind="moe_grouped_gemm", m=t, note=f"{model} {name} failed: {exc!s:.80}")
            del ws
            if device != "cpu":
                torch.cuda.empty_cache()


def environment(device: str) -> dict:
    env = {"torch": torch.__version__, "device": device, "date": time.strftime("%Y-%m-%d")}
    if device != "cpu":
        p = torch.cuda.get_device_properties(0)
        env.update(name=p.name, multiprocessors=p.multi_processor_count, memory_bytes=p.total_memory,
                   cuda=torch.version.cuda, hip=getattr(torch.version, "hip", None))
        try:
            env["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a check of the logic)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--sections", help="comma-separated section names to run (default: all)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    timer = Timer(args.device, 3 if args.quick else args.reps, 1 if args.quick else 3)
    dev = args.device
    if args.quick:
        sections = [
            ("gemm", lambda: gemm_cases(timer, dev, (("tiny", "p", 256, 128),), "bf16", (1, 16, 64), 2**20)),
            ("square", lambda: square_gemms(timer, dev, (128,), "bf16")),
            ("hbm", lambda: hbm_cases(timer, dev, (1,))),
            ("decode_attention", lambda: decode_attention_cases(timer, dev, (1, 2), (64,), 8, 2, 64, flush=2**20)),
            ("prefill_attention", lambda: prefill_attention_cases(timer, dev, (64,), 4, 2, 64)),
            ("kernel", lambda: kernel_cases(timer, dev)),
            ("decoder_layer", lambda: decoder_layer_cases(timer, dev, (1, 2), 64, 2, (128, 256, 4, 2, 32))),
            ("moe", lambda: moe_cases(timer, dev, (("tiny", 8, 2, 64, 32),), (1, 8), flush=2**20)),
            ("decode_attention_packed", lambda: packed_decode_attention_cases(
                timer, dev, (1, 2), (64,), (1, 3), 4, 2, 64, flush=2**20)),
        ]
    else:
        sections = [
            ("hbm", lambda: hbm_cases(timer, dev, (64, 256, 1024, 4096))),
            ("kernel", lambda: kernel_cases(timer, dev)),
            ("square_bf16", lambda: square_gemms(timer, dev, (1024, 2048, 4096, 8192, 16384), "bf16")),
            ("square_fp8", lambda: square_gemms(timer, dev, (1024, 2048, 4096, 8192, 16384), "fp8")),
            ("gemm_8b_bf16", lambda: gemm_cases(timer, dev, LLAMA_8B, "bf16", TOKENS, L2_FLUSH_BYTES)),
            ("gemm_70b_fp8", lambda: gemm_cases(timer, dev, LLAMA_70B, "fp8", TOKENS, L2_FLUSH_BYTES)),
            ("gemm_70b_bf16", lambda: gemm_cases(timer, dev, LLAMA_70B, "bf16", TOKENS, L2_FLUSH_BYTES)),
            ("decode_attention", lambda: decode_attention_cases(
                timer, dev, (1, 4, 16, 64, 256), (256, 1024, 4096, 16384, 65536))),
            ("prefill_attention", lambda: prefill_attention_cases(timer, dev, (512, 1024, 2048, 4096, 8192, 16384))),
            ("decoder_layer", lambda: decoder_layer_cases(timer, dev, (1, 16, 64, 256))),
            ("moe", lambda: moe_cases(timer, dev, MOE_SHAPES, (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096))),
            ("decode_attention_packed", lambda: packed_decode_attention_cases(
                timer, dev, (1, 4, 16, 64, 256), (256, 1024, 4096, 16384, 65536))),
            ("verify_attention", lambda: packed_decode_attention_cases(
                timer, dev, (16, 64), (1024, 4096), (1, 2, 3, 4, 5, 8, 16))),
            ("gemm_steps", lambda: gemm_cases(timer, dev, LLAMA_8B[2:3], "bf16", range(16, 529, 16), L2_FLUSH_BYTES)),
        ]
    if args.sections:
        wanted = set(args.sections.split(","))
        sections = [(n, f) for n, f in sections if n in wanted]
    (args.out / "environment.json").write_text(json.dumps(environment(dev), indent=1) + "\n")
    with open(args.out / "microbench.csv", "w", newline="") as fh:
        out = csv.DictWriter(fh, fieldnames=FIELDS)
        out.writeheader()
        for name, section in sections:
            t0 = time.perf_counter()
            n = 0
            try:
                for r in section():
                    out.writerow(r)
                    fh.flush()
                    n += 1
            except Exception as exc:    # noqa: BLE001 - one section failing keeps the others
                print(f"{name}: failed: {exc!r}", file=sys.stderr)
            print(f"{name}: {n} rows in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
