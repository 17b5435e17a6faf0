"""Many simulations for one question: the capacity plan and what-if sweeps."""
