"""Paper-style figures shared by the recipes.

Figures are `matplotlib.figure.Figure` objects rendered straight to PNG: no pyplot, so
importing fedjax_rep never changes the user's matplotlib backend.
"""

import numpy as np
from matplotlib.figure import Figure


def select(rows, **where):
  """Rows whose columns equal the given values."""
  return [r for r in rows if all(r.get(k) == v for k, v in where.items())]


def curves(rows, x: str, y: str, along: str | None = None, **where):
  """(xs, mean, low, high): y over seeds at each x (low/high = min/max over seeds).

  With `along` (e.g. "round"), points are grouped by that column instead and placed at the
  mean of x over seeds (x = wall_clock, which differs between seeds).
  Non-finite values (rounds after a run diverged) are left out of the statistics."""
  groups, positions = {}, {}
  for r in select(rows, **where) if where else rows:
    if r.get(y) not in (None, "") and np.isfinite(float(r[y])):
      key = r[along] if along else r[x]
      groups.setdefault(key, []).append(float(r[y]))
      positions.setdefault(key, []).append(float(r[x]))
  keys = sorted(groups)
  values = [np.array(groups[v]) for v in keys]
  xs = [np.mean(positions[v]) for v in keys] if along else keys
  return (np.array(xs), np.array([v.mean() for v in values]),
          np.array([v.min() for v in values]), np.array([v.max() for v in values]))


LINESTYLES = ("-", "--", ":", "-.")
GRID_LINE = "grid"  # the gid of a line of one grid combination


def line(ax, rows, x, y, label, along=None, **where):
  """Mean over seeds as a line with a min-max band (see `curves`). Runs that diverged are
  flagged: the label says how many seeds diverged, and an x marks the first divergence.

  Rows of a grid (a `grid` column: the label 'KEY=VALUE, ...' of their combination) get one
  line and band per combination, labelled "LABEL (KEY=VALUE, ...)" without the keys that
  `where` fixes, each in the next colour and in the line style of its combination's place
  among the rows' combinations; `save` then gathers the panels' legends into one below
  them."""
  rows = select(rows, **where)
  grids = list(dict.fromkeys(r["grid"] for r in rows if "grid" in r))
  if not grids:
    _line(ax, rows, x, y, label, along, "-")
  for i, grid in enumerate(grids):
    shown = ", ".join(part for part in grid.split(", ") if part.split("=")[0] not in where)
    _line(ax, select(rows, grid=grid), x, y, f"{label} ({shown})" if shown else label, along,
          LINESTYLES[i % len(LINESTYLES)], GRID_LINE)


def _line(ax, rows, x, y, label, along, linestyle, gid=None):
  """One mean line with its min-max band and divergence flags, over all of `rows`."""
  xs, mean, low, high = curves(rows, x, y, along)
  diverged = {r["seed"]: r["diverged_round"] for r in rows if r.get("diverged_round")}
  if diverged:
    seeds = len({r["seed"] for r in rows})
    label = f"{label} (diverged: {len(diverged)}/{seeds} seeds)"
  if not len(xs):
    ax.plot([], [], label=label, ls=linestyle, gid=gid)
    return
  (handle,) = ax.plot(xs, mean, label=label, marker="o" if len(xs) < 20 else None, ms=3,
                      ls=linestyle, gid=gid)
  ax.fill_between(xs, low, high, color=handle.get_color(), alpha=0.2, linewidth=0)
  if diverged and x == "round":
    first = min(diverged.values())
    last_finite = max(np.searchsorted(xs, first) - 1, 0)
    ax.plot([first], [mean[last_finite]], marker="x", ms=9, mew=2, color=handle.get_color(),
            ls="none")


def _legend_below(fig, bottom: float) -> float:
  """The fraction of the figure's height to leave free below the panels: `bottom`, and
  with lines of grid combinations (see `line`), whose long legends hide the curves, room
  for one legend that replaces the panels' legends (their entries, each label once, in
  columns that fit the figure's width) above `bottom`, the figure growing by its height."""
  axes = [ax for ax in fig.axes if ax.get_legend() is not None]
  if not any(line.get_gid() == GRID_LINE for ax in axes for line in ax.get_lines()):
    return bottom
  entries = {}
  for ax in axes:
    for handle, label in zip(*ax.get_legend_handles_labels()):
      entries.setdefault(label, handle)
    ax.get_legend().remove()
  fontsize = 8
  label_width = (max(map(len, entries)) * 0.55 * fontsize + 40) / 72  # inches, with handle
  rows = -(-len(entries) // max(1, int(fig.get_figwidth() / label_width)))
  below, height = bottom * fig.get_figheight(), (rows * 1.5 * fontsize + 12) / 72  # inches
  fig.set_figheight(fig.get_figheight() + height)
  fig.legend(list(entries.values()), list(entries), loc="lower center",
             bbox_to_anchor=(0.5, below / fig.get_figheight()),
             ncol=-(-len(entries) // rows), fontsize=fontsize)
  return (below + height) / fig.get_figheight()


def save(fig, file, bottom: float = 0.0) -> None:
  """Lays the figure out (leaving the `bottom` fraction free, e.g. for a figure legend, and
  room for the legend of grid lines, see `_legend_below`) and writes it to `file` as PNG."""
  fig.tight_layout(rect=(0, _legend_below(fig, bottom), 1, 1))
  fig.savefig(file, format="png", dpi=120)


def figure(panels: int, width: float = 4.2, height: float = 3.4, rows: int = 1):
  """A figure of `rows` x `panels` axes ([panels] when rows == 1, else [rows, panels])."""
  fig = Figure(figsize=(width * panels, height * rows))
  axes = fig.subplots(rows, panels, squeeze=False)
  return fig, axes[0] if rows == 1 else axes


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
