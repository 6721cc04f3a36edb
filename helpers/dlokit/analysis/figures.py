"""Figure plumbing shared by the plots: detached figures and the 'nothing to plot yet' figure.

Figures are made by pyplot (which loads the notebook's display backend) and closed at once: a
notebook shows the figure a cell returns, once, and tests inspect its lines and bars without a display.
"""
from __future__ import annotations

import base64
import io
import textwrap

import matplotlib.pyplot as plt
from matplotlib.figure import Figure


# JupyterLab's output area on a 1366-px laptop screen, file browser open, is 934 px: 9.3 inches at the inline
# backend's 100 dpi. A wider figure is shown shrunk to fit, its 10-point text read as 7.
MAX_WIDTH_IN = 9.2


def detached_figure(size) -> Figure:
    """A new figure that pyplot does not keep (no auto-display, no 'too many figures' warning), at most
    MAX_WIDTH_IN wide: a wider one is laid out narrower, not drawn wide and shown shrunk."""
    width, height = size
    figure = plt.figure(figsize=(min(width, MAX_WIDTH_IN), height), layout="constrained")
    plt.close(figure)
    return figure


def new_figure(nrows: int = 1, ncols: int = 1, *, size=(7, 4), **kwargs):
    figure = detached_figure(size)
    axes = figure.subplots(nrows, ncols, squeeze=False, **kwargs)
    return figure, axes


def message_figure(lines, title: str | None = None) -> Figure:
    """A figure that says why there is nothing (yet) to plot, e.g. 'run 1234: running or killed'."""
    if isinstance(lines, str):
        lines = [lines]
    figure = detached_figure((7, 0.6 + 0.35 * max(len(lines), 1)))
    ax = figure.add_subplot()
    ax.axis("off")
    ax.text(0.0, 1.0, "\n".join(lines) or "nothing to show", va="top", ha="left",
            family="monospace", fontsize=10, transform=ax.transAxes)
    if title:
        ax.set_title(title, loc="left")
    return figure


MAX_NOTES = 10


def add_notes(figure: Figure, notes: list[str]) -> None:
    """Small text under the plot listing runs left out and why."""
    if len(notes) > MAX_NOTES:  # a class's folder can hold many broken runs: the plot must keep its room
        notes = notes[:MAX_NOTES - 1] + [f"… and {len(notes) - MAX_NOTES + 1} more (see the table)"]
    if notes:
        width, height = figure.get_size_inches()
        per_line = max(40, int(width * 15))  # characters of 8-point text across the figure: longer notes wrap
        notes = [line for note in notes for line in textwrap.wrap(str(note), per_line, subsequent_indent="  ") or [""]]
        extra = 0.16 * len(notes)  # inches of text: the figure grows instead of squeezing the plot
        figure.set_size_inches(width, height + extra)
        share = extra / (height + extra)
        figure.text(0.01, 0.0, "\n".join(notes), fontsize=8, va="bottom", ha="left", color="dimgray")
        figure.get_layout_engine().set(rect=(0, share, 1, 1 - share))


def figure_png_base64(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def image_grid(dataset, rows: int = 1, columns: int = 8, by_class: bool = False) -> Figure:
    """A few images of an ImageFolder with their class: spread over the set, or, `by_class`, one per class and
    column (the first images of each class, row by row)."""
    figure, axes = new_figure(rows, columns, size=(12, 0.5 + 1.4 * rows))
    per_class = len(dataset) // max(1, len(dataset.classes))
    spread = range(0, len(dataset), max(1, len(dataset) // (rows * columns)))
    picked = [(k % columns) * per_class + k // columns for k in range(rows * columns)] if by_class else spread
    for ax, index in zip(axes.flat, picked):
        image, label = dataset[index]
        ax.imshow(image)
        ax.set_title(f"class {label}" if by_class else dataset.classes[label][-3:], fontsize=7 if by_class else 8)
    for ax in axes.flat:
        ax.axis("off")
    return figure
