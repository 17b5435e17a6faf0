"""What one GPU of a vLLM replica keeps for the KV cache: vLLM's memory profiling, term by term.

vLLM sizes the KV cache once, at start-up (vllm/v1/worker/gpu_worker.py, `Worker.determine_available_memory`):

    KV cache = total_gpu_memory x gpu_memory_utilization
               - (weights + torch peak increase of profile_run + non-torch increase)

* `total_gpu_memory` is what `torch.cuda.mem_get_info()` reports, in bytes: the vendors' "80 GB" (H100) or
  "192 GB" (MI300X) are binary figures less what the driver keeps, e.g. 79.1 GiB = 85.0e9 bytes on an H100
  (`GpuProfile.runtime_memory_bytes`; the profiles' `hbm_runtime_gib` with its source).
* `profile_run` (vllm/v1/worker/gpu_model_runner.py) runs one dummy forward pass of `max_num_batched_tokens`
  tokens spread over min(max_num_seqs, tokens) requests, then `_dummy_sampler_run` on the last hidden state of
  each request. The torch peak is the larger of the two phases (`profile_peak_bytes`): the forward's largest
  set of live activations in one layer, or the sampler's logits with its float32 working copies. At vLLM's
  defaults (8192 tokens, 1024 sequences) the sampler's is the larger, 5-10 GB by the vocabulary; the forward's
  wins at large token budgets (e.g. 131,072 batched tokens on one GPU: tens of GB for a 70B model).
* Non-torch memory (NCCL/RCCL channel buffers, the custom all-reduce's IPC buffers, the CUDA/HIP context's
  growth during the forward pass) is `NON_TORCH_BYTES` (measured at TP 1 and 2).
* CUDA/HIP graphs are captured after the KV cache is allocated and come out of the 1 - utilization margin,
  not out of the KV cache (vLLM up to 0.19 does not subtract a graph estimate by default; assumed).

`engine.activation_reserve_gb` set in a scenario replaces the torch-peak and non-torch terms with one figure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capacity.inputs.models import ModelArch

GIB = 2 ** 30

ACTIVATION_BYTES = 2
"""bf16/fp16 activations (the dtype vLLM runs the profiling pass in)."""

SAMPLER_BYTES_PER_LOGIT = 38.44
"""Peak bytes per (request, vocabulary entry) of the dummy sampler run. basis: measured, from vLLM's own
profiling log of Llama-3.1-8B-Instruct on one H100 (vLLM v0.11.0, defaults 8192 batched tokens and 1024
sequences: torch peak increase 4.76 GiB; llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md):
(4.76 GiB - the 64 MiB of hidden states) / (1024 x 128,256). Its parts: the V1 runner's dummy sampling metadata
asks for top-k and top-p (vllm/v1/worker/gpu_model_runner.py `_dummy_sampler_run`), so besides the model-dtype
logits and their float32 copy the sampler sorts them (float32 values and int64 indices), takes the softmax and
its cumulative sum and scatters the result back (vllm/v1/sample/ops/topk_topp_sampler.py `apply_top_k_top_p`).
The same constant gives the other models of that log within 1 % (tests/test_memory.py)."""

FUSED_MOE_CHUNK_TOKENS = 16 * 1024
"""Tokens the fused MoE kernel processes per chunk of its workspace (vllm/envs.py
VLLM_FUSED_MOE_CHUNK_SIZE default 16 * 1024)."""

NON_TORCH_BYTES = {1: 0.13 * GIB, "tp": 0.55 * GIB}
"""Non-torch memory growth during profiling (the collectives' buffers: NCCL/RCCL channels, vLLM's custom
all-reduce IPC buffers; the CUDA context's growth). basis: measured on H100 with vLLM v0.11.0 (the log of
SAMPLER_BYTES_PER_LOGIT): 0.13-0.14 GiB on one GPU for five models, 0.54-0.55 GiB at TP 2 for two; assumed the
same at TP 4 and 8 (no log of those was found) and on ROCm."""


def forward_peak_bytes(model: "ModelArch", num_tokens: int, tensor_parallel_size: int) -> float:
    """Largest set of activations live at once in one decoder layer of a `num_tokens` forward pass, per GPU:
    the residual stream and the normalised input (hidden size each) plus the layer's widest intermediates:
    attention's QKV projection and output; a dense MLP's gate+up output and its activation; a MoE block's
    router logits (float32), fused-MoE workspace (gate+up and activation per routed token, and the experts'
    outputs before the weighted sum, per FUSED_MOE_CHUNK_TOKENS chunk) and shared experts."""
    t, tp, h = float(num_tokens), tensor_parallel_size, model.hidden_size
    base = 2.0 * h
    q = model.num_attention_heads * model.head_dim
    kv = 2 * model.num_kv_heads * model.head_dim
    attention = base + (q + kv + q) / tp
    widths = [attention]
    if model.mlp_intermediate_size:
        widths.append(base + 3.0 * model.mlp_intermediate_size / tp)
    per_token = max(widths) * t * ACTIVATION_BYTES
    if model.num_moe_layers:
        chunk = min(t, FUSED_MOE_CHUNK_TOKENS) * model.experts_per_token
        moe = (t * (base + 3.0 * model.shared_expert_intermediate_size / tp) * ACTIVATION_BYTES
               + t * model.num_experts * 4.0
               + chunk * (3.0 * model.expert_intermediate_size / tp + h) * ACTIVATION_BYTES)
        per_token = max(per_token, moe)
    return per_token


def sampler_peak_bytes(model: "ModelArch", num_requests: int, num_tokens: int) -> float:
    """The dummy sampler run's peak: every request's logits over the full vocabulary (vLLM gathers the
    vocabulary-parallel logits on every rank) in SAMPLER_BYTES_PER_LOGIT, plus the forward's hidden states
    the runner still holds."""
    return (float(num_requests) * model.vocab_size * SAMPLER_BYTES_PER_LOGIT
            + float(num_tokens) * model.hidden_size * ACTIVATION_BYTES)


def profile_peak_bytes(model: "ModelArch", max_num_batched_tokens: int, max_num_seqs: int,
                       tensor_parallel_size: int) -> float:
    """torch peak increase of vLLM's profile_run on one GPU (module docstring). The forward pass's activations
    are freed before the sampler runs, so the peak is the larger phase, not their sum."""
    tokens = max_num_batched_tokens
    requests = min(max_num_seqs, tokens)
    return max(forward_peak_bytes(model, tokens, tensor_parallel_size),
               sampler_peak_bytes(model, requests, tokens))


def non_torch_bytes(tensor_parallel_size: int) -> float:
    return NON_TORCH_BYTES[1] if tensor_parallel_size <= 1 else NON_TORCH_BYTES["tp"]


def reserve_bytes(model: "ModelArch", max_num_batched_tokens: int, max_num_seqs: int,
                  tensor_parallel_size: int) -> float:
    """Memory besides the weights that vLLM's profiling takes from the KV cache budget of one GPU."""
    return (profile_peak_bytes(model, max_num_batched_tokens, max_num_seqs, tensor_parallel_size)
            + non_torch_bytes(tensor_parallel_size))
