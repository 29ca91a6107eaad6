"""Paper-style figures shared by the recipes.

Figures are `matplotlib.figure.Figure` objects rendered straight to PNG: no pyplot, so
importing fedjax_rep never changes the user's matplotlib backend. matplotlib itself is
imported when the first figure is made; `prefetch` starts that import in the background
while a run computes.
"""

import functools
import importlib
import math
import sys
import textwrap
import threading

import numpy as np


def _import_matplotlib() -> None:
  for name in ("matplotlib.figure", "matplotlib.lines"):
    importlib.import_module(name)


@functools.cache
def prefetch() -> None:
  """Starts importing matplotlib in a background thread, once per process, unless it is
  imported already (a figure made meanwhile waits for the import). Called just before
  compiled rounds run, the import overlaps them instead of holding up the Python work
  before them."""
  if "matplotlib.lines" not in sys.modules:
    threading.Thread(target=_import_matplotlib, daemon=True).start()


def select(rows, **where):
  """Rows whose columns equal the given values."""
  columns, values = tuple(where), tuple(where.values())
  return [r for r in rows if tuple(map(r.get, columns)) == values]


def curves(rows, x: str, y: str, along: str | None = None, **where):
  """(xs, mean, low, high): y over seeds at each x (low/high = min/max over seeds).

  With `along` (e.g. "round"), points are grouped by that column instead and placed at the
  mean of x over seeds (x = wall_clock, which differs between seeds).
  Non-finite values (rounds after a run diverged) are left out of the statistics."""
  rows = [r for r in (select(rows, **where) if where else rows)
          if r.get(y) not in (None, "")]
  values = np.array([float(r[y]) for r in rows], dtype=float)
  finite = np.isfinite(values)
  keys = np.array([r[along] if along else r[x] for r in rows])[finite]
  values = values[finite]
  xs, group = np.unique(keys, return_inverse=True)
  counts = np.bincount(group, minlength=len(xs))
  low, high = np.full(len(xs), np.inf), np.full(len(xs), -np.inf)
  np.minimum.at(low, group, values)
  np.maximum.at(high, group, values)
  if along:
    positions = np.array([float(r[x]) for r in rows])[finite]
    xs = np.bincount(group, positions, minlength=len(xs)) / counts
  return xs, np.bincount(group, values, minlength=len(xs)) / counts, low, high


LINESTYLES = ("-", "--", ":", "-.")
GRID_LINE = "grid"  # the gid of a line of one grid combination
DIVERGED_RUN = "diverged-run"  # the gid of a diverged run's curve (outside the autoscaling)
DIVERGED_MARK = "diverged-mark"  # the gid of the x at a diverged run's last finite point


def line(ax, rows, x, y, label, along=None, **where):
  """Mean over seeds as a line with a min-max band (see `curves`), over the runs that did
  not diverge. Runs that diverged are flagged: the label says how many seeds diverged, and
  on a per-round x axis (x = "round" or along = "round") each is drawn thin up to its last
  finite point, where an x marks it; the y-limits leave them out (see `_fit_diverged`).

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
  """One mean line with its min-max band over the rows of runs that did not diverge
  (`diverged_round` 0), and the diverged runs' curves and marks, over all of `rows`."""
  diverged = {}  # seed: the rows of its diverged run
  for r in rows:
    if r.get("diverged_round"):
      diverged.setdefault(r["seed"], []).append(r)
  if diverged:
    label = f"{label} (diverged at x: {len(diverged)}/{len({r['seed'] for r in rows})} seeds)"
  xs, mean, low, high = curves([r for r in rows if not r.get("diverged_round")], x, y, along)
  (handle,) = ax.plot(xs, mean, label=label, marker="o" if 0 < len(xs) < 20 else None, ms=3,
                      ls=linestyle, gid=gid)
  if len(xs):
    ax.fill_between(xs, low, high, color=handle.get_color(), alpha=0.2, linewidth=0)
  if along != "round" and x != "round":
    return
  for run in diverged.values():
    xs, values = curves(run, x, y, along)[:2]
    if len(xs):
      from matplotlib.lines import Line2D
      ax.add_artist(Line2D(xs, values, lw=0.8, alpha=0.6, ls=linestyle,
                           color=handle.get_color(), gid=DIVERGED_RUN))
      ax.add_artist(Line2D(xs[-1:], values[-1:], marker="x", ms=8, mew=2, ls="none",
                           color=handle.get_color(), clip_on=False, gid=DIVERGED_MARK))


def _fit_diverged(ax) -> None:
  """Keeps the y-limits that the autoscaling gives the curves of runs that did not diverge
  (diverged runs' curves were added outside it), or where no run of the panel is left
  (its data limits have no height), takes in the diverged runs' curves; then moves each
  divergence mark into the y-limits: a run that left them is marked at their edge, which
  moves out by 6% of the axis (on its scale) to make room for the mark."""
  runs = [a for a in ax.lines if a.get_gid() == DIVERGED_RUN]
  if runs and not ax.dataLim.height > 0:
    for run in runs:
      ax.update_datalim(run.get_xydata())
    ax.autoscale_view()
  marks = [a for a in ax.lines if a.get_gid() == DIVERGED_MARK]
  if not marks:
    return
  low, high = sorted(ax.get_ylim())
  values = np.concatenate([mark.get_ydata() for mark in marks])
  scale = ax.yaxis.get_transform()
  scaled_low, scaled_high = scale.transform([low, high])
  pad = 0.06 * (scaled_high - scaled_low)
  ax.set_ylim(scale.inverted().transform([scaled_low - pad * (values < low).any(),
                                          scaled_high + pad * (values > high).any()]))
  for mark in marks:
    mark.set_ydata(np.clip(mark.get_ydata(), low, high))


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


def _fit_title(fig) -> None:
  """Wraps the figure's title (suptitle) onto lines that fit the figure's width."""
  title = fig.get_suptitle()
  if title:
    fontsize = 12  # points: matplotlib's "large", the default suptitle size
    chars = int(fig.get_figwidth() * 72 / (0.55 * fontsize))  # an average character's width
    fig.suptitle(textwrap.fill(title, max(chars, 20)), fontsize=fontsize)


def save(fig, file, bottom: float = 0.0) -> None:
  """Lays the figure out (y-limits without the diverged runs, see `_fit_diverged`; the title
  wrapped to the width; leaving the `bottom` fraction free, e.g. for a figure legend, and
  room for the legend of grid lines, see `_legend_below`) and writes it to `file` as PNG."""
  for ax in fig.axes:
    _fit_diverged(ax)
  _fit_title(fig)
  fig.tight_layout(rect=(0, _legend_below(fig, bottom), 1, 1))
  fig.savefig(file, format="png", dpi=120)


def figure(panels: int, width: float = 4.2, height: float = 3.4, rows: int = 1):
  """A figure of `rows` x `panels` axes ([panels] when rows == 1, else [rows, panels])."""
  from matplotlib.figure import Figure
  fig = Figure(figsize=(width * panels, height * rows))
  axes = fig.subplots(rows, panels, squeeze=False)
  return fig, axes[0] if rows == 1 else axes


def grid_of(panels: int, columns: int | None = None, width: float = 4.2,
            height: float = 3.4):
  """A figure of `panels` axes [panels] in rows of `columns` (default the near-square
  ceil(sqrt(panels))), the last row's unused cells left empty."""
  columns = columns or math.ceil(math.sqrt(panels))
  fig, axes = figure(columns, width, height, rows=-(-panels // columns))
  axes = np.reshape(axes, -1)
  for ax in axes[panels:]:
    ax.remove()
  return fig, axes[:panels]


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
