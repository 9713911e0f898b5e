"""Matplotlib for the scripts that draw a figure: an optional extra (`.[plots]`), files only."""

from __future__ import annotations


def pyplot():
    """matplotlib.pyplot on the Agg backend (files, no display), or an exit naming the install."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("the plot needs matplotlib: .venv/bin/pip install -e '.[plots]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
