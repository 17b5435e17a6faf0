"""Self-contained HTML reports (Plotly), figures, exports and the draft-and-verify explainer."""
