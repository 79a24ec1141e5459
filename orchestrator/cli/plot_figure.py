"""The figure every picture of a plan is drawn on, and its SVG text, byte-deterministic: text kept
as text (``svg.fonttype: none``, no embedded font), a fixed ``svg.hashsalt`` for the ids matplotlib
makes up, no date or creator in the metadata. The pictures give an id (``gid``) to every bar, so
that a test or a reviewer can find each bar and the number it stands for."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # matplotlib is imported only when a picture is drawn
    from matplotlib.typing import RcKeyType

_RC: dict[RcKeyType, str | int | bool] = {
    "svg.fonttype": "none",
    "svg.hashsalt": "dsorch",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def figure(width: float, height: float):
    """A matplotlib figure (no pyplot: no global figure manager) with the settings that make its SVG deterministic."""
    import matplotlib
    from matplotlib.figure import Figure

    matplotlib.rcParams.update(_RC)
    return Figure(figsize=(width, height), dpi=100)


def svg_text(fig) -> str:
    """The figure as SVG text, with no date or creator in the metadata."""
    import io

    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    return buf.getvalue()
