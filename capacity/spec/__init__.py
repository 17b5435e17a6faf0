"""Speculative decoding: the engine's interface, drafting methods and their cost, acceptance models, policies."""
