"""Helpers every layer may use: progress on stderr, NaN-safe JSON."""
