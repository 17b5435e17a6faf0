"""The HTML page every report and the explainer share: plotly.js inline exactly once, the stylesheet,
and a figure as a fragment that calls the page's global Plotly (so a report opens offline)."""

from __future__ import annotations

import html

import plotly.graph_objects as go

_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; margin: 0 auto;
       max-width: 1250px; padding: 1em 2em; color: #222; }
header { border-bottom: 1px solid #ddd; margin-bottom: 1em; }
header p { color: #555; margin: 0.2em 0 0.8em; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { font-size: 1.25em; }
section.summary ul { line-height: 1.5; }
section.figure, section.explainer { margin: 1.5em 0; border-top: 1px solid #eee; padding-top: 0.5em; }
.controls { display: flex; gap: 2.5em; flex-wrap: wrap; } .controls input { width: 260px; vertical-align: middle; }
.stats { color: #333; } .skipped { color: #777; font-size: 0.9em; }
"""


def page(title: str, sections: list[str], header: str = "") -> str:
    """A complete HTML page with plotly.js inline exactly once (in <head>); `sections` are HTML fragments
    whose plots call the global Plotly."""
    from plotly.offline import get_plotlyjs   # plotly.offline/plotly.io add ~0.1 s: only a written page needs them

    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{_CSS}</style>\n"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script>\n</head>\n<body>\n"
            f"<header>{header}</header>\n" + "\n".join(sections) + "\n</body>\n</html>\n")


def figure_div(fig: go.Figure, div_id: str) -> str:
    import plotly.io as pio   # as above

    return pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})
