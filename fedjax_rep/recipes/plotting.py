"""Paper-style figures shared by the recipes.

Figures are `matplotlib.figure.Figure` objects rendered straight to PNG: no pyplot, so
importing fedjax_rep never changes the user's matplotlib backend.
"""

import numpy as np
from matplotlib.figure import Figure


def select(rows, **where):
  """Rows whose columns equal the given values."""
  return [r for r in rows if all(r.get(k) == v for k, v in where.items())]


def curves(rows, x: str, y: str, **where):
  """(xs, mean, low, high): y over seeds at each x (low/high = min/max over seeds)."""
  chosen = [r for r in select(rows, **where) if r.get(y) not in (None, "")]
  xs = sorted({r[x] for r in chosen})
  values = [np.array([r[y] for r in chosen if r[x] == v], float) for v in xs]
  return (np.array(xs), np.array([v.mean() for v in values]),
          np.array([v.min() for v in values]), np.array([v.max() for v in values]))


def line(ax, rows, x, y, label, **where):
  """Mean over seeds as a line with a min-max band."""
  xs, mean, low, high = curves(rows, x, y, **where)
  if not len(xs):
    return
  (handle,) = ax.plot(xs, mean, label=label, marker="o" if len(xs) < 20 else None, ms=3)
  ax.fill_between(xs, low, high, color=handle.get_color(), alpha=0.2, linewidth=0)


def save(fig, file) -> None:
  fig.tight_layout()
  fig.savefig(file, format="png", dpi=120)


def figure(panels: int, width: float = 4.2, height: float = 3.4):
  fig = Figure(figsize=(width * panels, height))
  return fig, fig.subplots(1, panels, squeeze=False)[0]


LABELS = {"local": "Local only", "fedavg": "FedAvg", "fedrep": "FedRep"}


def one_panel(rows, x: str, y: str, algorithms, file, *, xlabel: str, ylabel: str, title: str,
              vline: float | None = None) -> None:
  """One panel, one line (mean over seeds, min-max band) per algorithm, log y axis."""
  fig, (ax,) = figure(1, width=5.5)
  for name in algorithms:
    line(ax, rows, x, y, LABELS.get(name, name), algorithm=name)
  if vline is not None:
    ax.axvline(vline, color="grey", ls=":", lw=1)
  ax.set(yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
  ax.legend()
  save(fig, file)
