"""capacity: a capacity planner for LLM serving with speculative decoding on AMD Instinct GPUs."""

__version__ = "0.1.0"

from capacity.sweep import load_results  # noqa: E402,F401
