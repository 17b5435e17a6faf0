"""capacity: a capacity planner for LLM serving with speculative decoding on AMD Instinct GPUs.

The package is layered (docs/architecture.md): util, errors, paths <- inputs <- cost <- spec <- sim
<- {measurements, studies} <- fidelity <- report <- cli. This file is the public front door and
imports nothing at start-up, so `import capacity.errors` does not pull in the whole package; the
notebook API (`capacity.simulate`, `capacity.plan`, `capacity.sweep`: capacity/api.py) loads on first use.
"""

__version__ = "0.1.0"


_API = ("simulate", "plan", "sweep")


def __getattr__(name: str):
    # `capacity.simulate(...)`, `capacity.plan(...)`, `capacity.sweep(...)` (capacity/api.py) and
    # `capacity.load_results(DIR)`, imported on first use: they pull in pandas and the simulator,
    # which a plain `import capacity.<module>` should not pay for.
    if name in _API:
        from capacity import api
        return getattr(api, name)
    if name == "load_results":
        from capacity.studies.sweep import load_results
        return load_results
    raise AttributeError(f"module 'capacity' has no attribute {name!r}")
