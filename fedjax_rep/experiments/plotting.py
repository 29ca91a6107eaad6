"""Paper-style figures shared by the recipes.

Figures are `matplotlib.figure.Figure` objects rendered straight to PNG: no pyplot, so
importing fedjax_rep never changes the user's matplotlib backend. matplotlib itself is
imported when the first figure is made; `prefetch` starts that import in the background
while a run computes.
"""

import functools
import importlib
import math
import re
import sys
import textwrap
import threading

import numpy as np

from fedjax_rep.experiments import labels


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
DIVERGED_RUN = "diverged-run"  # the gid of a diverged run's curve (outside the autoscaling)
DIVERGED_MARK = "diverged-mark"  # the gid of the x at a diverged run's last finite point


def line(ax, rows, x, y, label, along=None, style=None, **where):
  """Mean over seeds as a line with a min-max band (see `curves`), over the runs that did
  not diverge. Runs that diverged are flagged: the label says how many seeds diverged, and
  on a per-round x axis (x = "round" or along = "round") each is drawn thin up to its last
  finite point, where an x marks it; the y-limits leave them out (see `_fit_diverged`).

  Rows of a grid (a `grid` column: the label 'KEY=VALUE, ...' of their combination) get one
  line and band per combination, labelled "LABEL (KEY=VALUE, ...)" without the keys that
  `where` fixes, each in the next colour and in the line style of its combination's place
  among the rows' combinations. `style` (e.g. {"color": "C1", "ls": "--"}) sets these
  properties of every line drawn instead. `save` explains every panel's lines in one
  legend below them."""
  rows = select(rows, **where)
  grids = list(dict.fromkeys(r["grid"] for r in rows if "grid" in r))
  if not grids:
    _line(ax, rows, x, y, label, along, "-", style)
  for i, grid in enumerate(grids):
    shown = ", ".join(part for part in grid.split(", ") if part.split("=")[0] not in where)
    _line(ax, select(rows, grid=grid), x, y, f"{label} ({shown})" if shown else label, along,
          LINESTYLES[i % len(LINESTYLES)], style)


# The attribute of a `_line` handle that holds the runs it draws, [(seed, ids of the run's
# rows, whether it diverged)], for `_legend_entries` to count runs that several panels draw
# once (other handles, e.g. bars, have none).
RUNS = "fedjax_rep_runs"


def _line(ax, rows, x, y, label, along, linestyle, style=None):
  """One mean line with its min-max band over the rows of runs that did not diverge
  (`diverged_round` 0), and the diverged runs' curves and marks, over all of `rows` (one
  run per seed), in `linestyle` and the next colour unless `style` sets them; its runs are
  recorded on its handle (`RUNS`)."""
  runs = {}  # seed: the rows of its run
  for r in rows:
    runs.setdefault(r["seed"], []).append(r)
  diverged = {seed for seed, run in runs.items() if any(r.get("diverged_round") for r in run)}
  if diverged:
    label = f"{label} (diverged at x: {len(diverged)}/{len(runs)} seeds)"
  xs, mean, low, high = curves([r for r in rows if not r.get("diverged_round")], x, y, along)
  (handle,) = ax.plot(xs, mean, label=label, marker="o" if 0 < len(xs) < 20 else None, ms=3,
                      **{"ls": linestyle, **(style or {})})
  linestyle = handle.get_linestyle()
  setattr(handle, RUNS, [(seed, frozenset(map(id, run)), seed in diverged)
                         for seed, run in runs.items()])
  if len(xs):
    ax.fill_between(xs, low, high, color=handle.get_color(), alpha=0.2, linewidth=0)
  if along != "round" and x != "round":
    return
  for seed in diverged:
    xs, values = curves([r for r in runs[seed] if r.get("diverged_round")], x, y, along)[:2]
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
  moves out by 6% of the axis (on its scale) to make room for the mark. A panel of lines
  that all diverged before a finite value says so in its middle, without ticks."""
  drawn = [a for a in ax.lines if np.isfinite(np.asarray(a.get_ydata(), float)).any()]
  if not drawn and any(DIVERGED_LABEL.match(str(a.get_label())) for a in ax.lines):
    ax.text(0.5, 0.5, "nothing to draw:\nevery run diverged before a finite value",
            transform=ax.transAxes, ha="center", va="center", fontsize=LABEL_SIZE)
    ax.tick_params(which="both", left=False, bottom=False, labelleft=False,
                   labelbottom=False)
    return
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


TITLE_SIZE, PANEL_TITLE_SIZE, LABEL_SIZE, TICK_SIZE, LEGEND_SIZE = 12, 10, 9, 8, 9  # points


def _wrap(text: str, inches: float, fontsize: float) -> str:
  """`text` with each of its lines wrapped at spaces onto lines of at most `inches` at
  `fontsize` (a $...$ formula without spaces stays whole)."""
  chars = max(int(inches * 72 / (0.5 * fontsize)), 20)  # an average character's width
  return "\n".join(textwrap.fill(part, chars, break_long_words=False, break_on_hyphens=False)
                   for part in text.split("\n"))


def _style(fig) -> None:
  """One style for every figure: the figure's title (suptitle) and each panel's title and
  axis labels in their sizes (TITLE_SIZE, ...) and wrapped to the figure's or the panel's
  width (the y label to its height); the figure's title 0.1 inch below the top edge at any
  height (`tight_layout` leaves room for it there); readable tick labels (see
  `_readable_log_ticks`)."""
  title = fig.get_suptitle()
  if title:
    fig.suptitle(_wrap(title, fig.get_figwidth(), TITLE_SIZE), fontsize=TITLE_SIZE,
                 y=1 - 0.1 / fig.get_figheight())
  for ax in fig.axes:
    width, height = ax.get_position().size * fig.get_size_inches()
    for text, inches, size in ((ax.title, width, PANEL_TITLE_SIZE),
                               (ax.xaxis.label, width, LABEL_SIZE),
                               (ax.yaxis.label, height, LABEL_SIZE)):
      text.set(text=_wrap(text.get_text(), inches, size), fontsize=size)
    ax.tick_params(labelsize=TICK_SIZE)
    _readable_log_ticks(ax.xaxis)
    _readable_log_ticks(ax.yaxis)


def _readable_log_ticks(axis) -> None:
  """Plain tick labels ('0.14', not 1.4x10^-1) on a log axis that spans under two decades,
  where matplotlib would label its minor ticks or only one decade: at 1, 2 and 5 x 10^i, or
  under one decade at up to six evenly spaced values. Ticks that a recipe set are kept."""
  from matplotlib import ticker  # loaded with the figure
  if axis.get_scale() != "log" or isinstance(axis.get_major_locator(), ticker.FixedLocator):
    return
  low, high = sorted(axis.get_view_interval())
  decades = np.log10(high / low)
  if decades >= 2:
    return
  axis.set_major_locator(ticker.MaxNLocator(6) if decades < 1 else
                         ticker.LogLocator(subs=(1, 2, 5)))
  axis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
  axis.set_minor_formatter(ticker.NullFormatter())


DIVERGED_LABEL = re.compile(r"(.*) \(diverged at x: (\d+)/(\d+) seeds\)")  # see `_line`


def _distinct_runs(runs) -> list[tuple[int, bool]]:
  """The distinct runs of `runs` ([(seed, row ids, diverged)], see `RUNS`), as
  [(seed, diverged)]: runs that share a row (one run drawn in several panels, e.g. its
  loss and its accuracy) are one, diverged if any of them is."""
  distinct = []  # [(row ids, seed, diverged)]
  for seed, ids, diverged in runs:
    shared = [d for d in distinct if d[0] & ids]
    distinct = [d for d in distinct if not d[0] & ids]
    distinct.append((ids.union(*(d[0] for d in shared)), seed,
                     diverged or any(d[2] for d in shared)))
  return [(seed, diverged) for _, seed, diverged in distinct]


def _legend_entries(fig) -> dict:
  """{label: handle}: each label of the panels' lines once, drawn as where it first appears.
  A line whose runs diverged (labelled 'LABEL (diverged at x: D/S seeds)' in a panel, see
  `_line`) is one entry 'LABEL (diverged at x: D/R seeds)' over the distinct runs of its
  panels (`_distinct_runs`): D of its R runs diverged; 'runs' instead of 'seeds' where
  runs of the same seed are in different panels (e.g. one panel per setting)."""
  handles, runs = {}, {}  # LABEL: handle; LABEL: its runs in every panel (see `RUNS`)
  for ax in fig.axes:
    for handle, label in zip(*ax.get_legend_handles_labels()):
      match = DIVERGED_LABEL.fullmatch(label)
      label = match[1] if match else label
      handles.setdefault(label, handle)
      runs.setdefault(label, []).extend(getattr(handle, RUNS, []))
  entries = {}
  for label, handle in handles.items():
    distinct = _distinct_runs(runs[label])
    diverged = sum(d for _, d in distinct)
    unit = "seeds" if len({seed for seed, _ in distinct}) == len(distinct) else "runs"
    entries[f"{label} (diverged at x: {diverged}/{len(distinct)} {unit})" if diverged
            else label] = handle
  return entries


def _legend_below(fig) -> float:
  """One legend for all the panels below them, replacing any panel legend: the entries of
  `_legend_entries`, in columns that fit the figure's width; the figure grows by its height,
  which is returned as a fraction of the figure's."""
  entries = _legend_entries(fig)
  for ax in fig.axes:
    if ax.get_legend() is not None:
      ax.get_legend().remove()
  if not entries:
    return 0.0
  label_width = (max(map(len, entries)) * 0.55 * LEGEND_SIZE + 40) / 72  # inches, with handle
  rows = -(-len(entries) // max(1, int(fig.get_figwidth() / label_width)))
  height = (rows * 1.5 * LEGEND_SIZE + 4) / 72  # inches
  fig.set_figheight(fig.get_figheight() + height)
  fig.legend(list(entries.values()), list(entries), loc="lower center",
             bbox_to_anchor=(0.5, 0), ncol=-(-len(entries) // rows), fontsize=LEGEND_SIZE)
  return height / fig.get_figheight()


def save(fig, file) -> None:
  """Lays the figure out and writes it to `file` as PNG: y-limits without the diverged runs
  (see `_fit_diverged`), the panels' lines explained by one legend below them (see
  `_legend_below`), and the one style of `_style`."""
  for ax in fig.axes:
    _fit_diverged(ax)
  bottom = _legend_below(fig)
  _style(fig)
  fig.tight_layout(rect=(0, bottom, 1, 1))
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


def one_panel(rows, x: str, y: str, algorithms, file, *, xlabel: str, ylabel: str, title: str,
              vline: tuple[float, str] | None = None) -> None:
  """One panel, one line (mean over seeds, min-max band) per algorithm, log y axis, and a
  dotted vertical line at x = vline[0] labelled vline[1]; the legend below it."""
  fig, (ax,) = figure(1, width=5.5)
  for name in algorithms:
    line(ax, rows, x, y, labels.label(name), algorithm=name)
  if vline is not None:
    ax.axvline(vline[0], color="grey", ls=":", lw=1, label=vline[1])
  ax.set(yscale="log", xlabel=xlabel, ylabel=ylabel)
  fig.suptitle(title)
  save(fig, file)
