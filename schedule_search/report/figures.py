"""Figures written like every other record: rendered in memory, renamed into place."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a cluster node or in CI
import matplotlib.pyplot as plt

from schedule_search.core.files import atomic_write_bytes

__all__ = ["plt", "save_figure"]  # pyplot, set up headless for every report module


def save_figure(figure: plt.Figure, path: Path) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    atomic_write_bytes(path, buffer.getvalue())
