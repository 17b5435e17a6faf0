"""The discrete-event simulation of vLLM v1 serving (SimPy) and its result: engine, cluster, metrics, result folder."""
