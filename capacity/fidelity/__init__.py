"""The model held against measurements: validation of serving rows and speculative speedups, calibration."""
