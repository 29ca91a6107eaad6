"""Comparing run directories (`fedjax-rep compare DIR DIR ...`): the configuration keys
whose values differ between the runs, their summary tables side by side under those keys,
and one figure of a metric's mean over seeds against round, a panel per algorithm and a
line per run. Of a run with a grid, by default only each algorithm's combination chosen on
validation data. Reads only the directories' config.json, metrics.csv, summary table and
selection.csv: no jax."""

import contextlib
import csv
import dataclasses
import functools
import json
import math
import os
import shlex
import sys

from fedjax_rep.core import files
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import csv_tables
from fedjax_rep.experiments import labels
from fedjax_rep.experiments import plotting

# The figure's default metric: the first of these that every run has at two rounds or more
# (the papers' headline numbers first, then what the linear recipes track, then the
# training loss that every recipe logs).
METRICS = ("test_accuracy", "model_error", "test_error", "new_client_error",
           "finetune_error", "principal_angle", "global_grad_norm", "train_loss")
RUN_COLUMNS = ("algorithm", "seed", "round", "grid", "diverged", "diverged_round")
OTHER_TABLES = ("metrics.csv", "selection.csv")  # the CSV files that are not a summary
# The summary columns that the printed table keeps where a run has a grid, besides the
# run, the differing keys, the settings and the grid label.
STATISTICS = ("test_accuracy", "test_accuracy_std_over_seeds", "val_accuracy",
              "new_accuracy", "participation_gap")


@dataclasses.dataclass(frozen=True)
class Run:
  """What compare reads of a run directory.

  Attributes:
    name: the directory as given.
    saved: its config.json.
    rows: its metrics.csv rows, numbers as int or float, empty cells as "".
    columns: the metrics.csv columns, in order.
    summary: its summary table's rows (cells as written), [] where it has none.
    selection: its selection.csv rows (cells as written; `fedjax-rep run --select`), []
      where it has none.
  """
  name: str
  saved: dict
  rows: list
  columns: list
  summary: list
  selection: list


def _problem(path: str) -> str | None:
  """Why `path` is not a run directory that compare can read, or None where it is one."""
  if not os.path.exists(path):
    return f"{path} does not exist"
  if not os.path.isdir(path):
    return f"{path} is a file, not a run directory"
  if not os.path.isfile(os.path.join(path, "config.json")):
    return f"{path} is not a run directory (a directory without a config.json)"
  if not os.path.isfile(os.path.join(path, "metrics.csv")):
    return (f"{path} has no metrics.csv yet (the run has not finished: finish it with "
            f"`fedjax-rep run --resume {shlex.quote(path)}`)")
  return None


def check_dirs(paths) -> None:
  """Checks that every path is a distinct run directory with its metrics written.

  Args:
    paths: the directories to compare.

  Returns:
    None. Raises a ConfigError naming every path that is missing, not a run directory (no
    config.json), without a metrics.csv or given twice, and what to do; or when fewer
    than two paths are given.
  """
  if len(paths) < 2:
    raise cfg.ConfigError(f"compare needs two run directories or more, got {len(paths)}: "
                          f"give the --out directories of `fedjax-rep run` runs")
  problems = [problem for problem in map(_problem, paths) if problem]
  seen = {}
  for path in paths:
    if os.path.exists(path):
      seen.setdefault(os.path.realpath(path), []).append(path)
  problems += [f"{' and '.join(same)} are one directory" for same in seen.values()
               if len(same) > 1]
  if problems:
    raise cfg.ConfigError(f"cannot compare: {'; '.join(problems)}; give the --out "
                          f"directories of finished `fedjax-rep run` runs, each once")


def _number(cell: str):
  """A metrics.csv cell as an int or a float where it is one, else the text itself."""
  for kind in (int, float):
    with contextlib.suppress(ValueError):
      return kind(cell)
  return cell


def _summary_file(path: str) -> str | None:
  """The summary table of the run directory `path` (e.g. summary.csv or table1.csv): the
  CSV file its .complete lists besides metrics.csv and selection.csv, or where it has no
  .complete such a CSV file in it; None where it has none."""
  try:
    with open(os.path.join(path, ".complete")) as f:
      names = json.load(f)["files"]
  except (OSError, ValueError, KeyError, TypeError):
    names = sorted(os.listdir(path))
  tables = [name for name in names if name.endswith(".csv") and name not in OTHER_TABLES
            and os.path.isfile(os.path.join(path, name))]
  return tables[0] if tables else None


def read_run(path: str) -> Run:
  """Reads a run directory.

  Args:
    path: a directory that `check_dirs` accepts.

  Returns:
    Its Run: config.json, metrics.csv (cells as numbers where they are ones), its summary
    table and its selection.csv. Raises a ConfigError when its config.json or metrics.csv
    cannot be read.
  """
  try:
    with open(os.path.join(path, "config.json")) as f:
      saved = json.load(f)
    with open(os.path.join(path, "metrics.csv"), newline="") as f:
      reader = csv.DictReader(f)
      rows = [{k: _number(v) if v else "" for k, v in row.items()} for row in reader]
      columns = list(reader.fieldnames or ())
  except (OSError, ValueError) as error:
    raise cfg.ConfigError(f"{path} cannot be read as a run directory ({error}): give the "
                          f"--out directory of a finished `fedjax-rep run`") from None
  if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict):
    raise cfg.ConfigError(f"{path}/config.json is not a run's config.json (no 'config' "
                          f"entry): give the --out directory of a `fedjax-rep run`")
  summary, selection = [], []
  name = _summary_file(path)
  if name is not None:
    with open(os.path.join(path, name), newline="") as f:
      summary = list(csv.DictReader(f))
  if os.path.isfile(os.path.join(path, "selection.csv")):
    with open(os.path.join(path, "selection.csv"), newline="") as f:
      selection = list(csv.DictReader(f))
  return Run(path, saved, rows, columns, summary, selection)


def read_runs(paths) -> list[Run]:
  """Reads run directories, all checked first.

  Args:
    paths: the directories to compare (two or more).

  Returns:
    Their Runs, in order. Raises a ConfigError as `check_dirs` does, before reading any.
  """
  check_dirs(paths)
  return [read_run(path) for path in paths]


def flat_config(saved: dict) -> dict:
  """The configuration of a run as one flat dict of comparable keys.

  Args:
    saved: a run's config.json.

  Returns:
    {key: value}: `recipe`, `quick`, `seeds`, every configuration field by its name (the
    options of `options` by theirs) and each swept key of the grid as `grid.KEY` (its
    values). Values as config.json holds them (lists for sequences).
  """
  flat = {key: saved.get(key) for key in ("recipe", "quick", "seeds")}
  config = saved.get("config") or {}
  flat.update((key, value) for key, value in config.items() if key != "options")
  flat.update((name, value) for name, value in config.get("options") or ())
  flat.update((f"grid.{key}", values) for key, values in (saved.get("grid") or {}).items())
  return flat


def differing_keys(runs: list[Run]) -> list[str]:
  """The configuration keys whose values are not the same in every run.

  Args:
    runs: the runs to compare.

  Returns:
    The keys of `flat_config` whose values differ between runs (a key that some run lacks
    counts as differing), in the order of first appearance across the runs.
  """
  flats = [flat_config(run.saved) for run in runs]
  keys = list(dict.fromkeys(key for flat in flats for key in flat))
  missing = object()
  return [key for key in keys
          if any(flat.get(key, missing) != flats[0].get(key, missing) for flat in flats)]


def _setting_names(saved: dict) -> set:
  """The names that a column holding a setting of the run may have: a configuration field
  or option (`flat_config`, but recipe, quick and seeds), such a sequence field without
  its plural s (algorithms: algorithm, speed_models: speed_model), or a swept key of the
  grid."""
  flat = {key: value for key, value in flat_config(saved).items()
          if key not in ("recipe", "quick", "seeds")}
  names = {key.removeprefix("grid.") for key in flat}
  return names | {key[:-1] for key, value in flat.items() if key.endswith("s")
                  and isinstance(value, list)}


def _val_score(row: dict) -> float:
  """A summary row's val_accuracy as a float, NaN where it is empty, absent or not a
  number."""
  value = _number(str(row.get("val_accuracy", "")))
  return float(value) if isinstance(value, (int, float)) else math.nan


def choice(run: Run) -> list[dict] | None:
  """The combinations of the run's grid that compare shows by default.

  Args:
    run: a run.

  Returns:
    [{setting column: value, ..., "grid": label}]: per algorithm and setting (the columns
    of its selection.csv or summary that `_setting_names` names but the swept keys, e.g.
    algorithm, num_clients), the combination of its selection.csv row (`fedjax-rep run
    --select`); without a selection.csv, that of the summary row of the largest
    val_accuracy (the first of equals; NaN never wins; every combination of a setting
    where none has a finite one). None where the run has no grid, or neither a
    selection.csv nor a summary with a grid column and a finite val_accuracy: every
    combination is shown.
  """
  grid = run.saved.get("grid") or {}
  if not grid:
    return None
  names = _setting_names(run.saved) - set(grid)

  def setting(row):
    return {key: value for key, value in row.items() if key in names}

  if run.selection:
    return [{**setting(row), "grid": row["grid"]} for row in run.selection]
  scores = list(map(_val_score, run.summary))
  if not any(math.isfinite(score) for score in scores) or "grid" not in run.summary[0]:
    return None
  groups = {}  # the setting's values: [(score, row)]
  for row, score in zip(run.summary, scores):
    groups.setdefault(tuple(setting(row).values()), []).append((score, row))
  chosen = []
  for group in groups.values():
    finite = [entry for entry in group if math.isfinite(entry[0])]
    best = [max(finite, key=lambda entry: entry[0])] if finite else group
    chosen += [{**setting(row), "grid": row["grid"]} for _, row in best]
  return chosen


def _shown(run: Run, rows: list[dict], all_combinations: bool) -> list[dict]:
  """The rows of `rows` (the run's metrics.csv or summary rows) that compare shows: every
  row with all_combinations or where the run has no `choice`, else the rows of the chosen
  combinations (those that agree with a choice in each of its columns that they have, the
  cells compared as `_number` parses their text)."""
  chosen = None if all_combinations else choice(run)
  if chosen is None:
    return rows
  value = functools.cache(lambda cell: _number(str(cell)))  # each distinct cell parsed once
  wanted = [{key: value(cell) for key, cell in c.items()} for c in chosen]
  return [row for row in rows if any(all(value(row[key]) == v for key, v in w.items()
                                         if key in row) for w in wanted)]


def summary_rows(runs: list[Run], keys: list[str], all_combinations: bool = False,
                 every_column: bool = False) -> list[dict]:
  """The runs' summary tables side by side.

  Args:
    runs: the runs to compare.
    keys: the configuration keys to show (`differing_keys`).
    all_combinations: every row of a run with a grid, not only those of its chosen
      combinations (`choice`).
    every_column: every summary column, also where some run has a grid.

  Returns:
    One row per run and row of its summary table that compare shows (`_shown`; one row,
    of the keys only, for a run without a summary table): `run` (the directory as given),
    the run's value of each key (`cfg.setting_text`; empty where it lacks the key), then
    the summary's columns. A summary column of the same name as a key (a grid's swept
    key) gives that key's value in its rows: the value the row ran with. Where some run
    has a grid and not every_column, the summary's columns are only the settings
    (`_setting_names`: algorithm, num_clients, the swept keys, ...), `grid` and STATISTICS.
  """
  narrow = not every_column and any(run.saved.get("grid") for run in runs)
  table = []
  for run in runs:
    flat = flat_config(run.saved)
    values = {key: cfg.setting_text(flat[key]) if key in flat else "" for key in keys}
    kept = _setting_names(run.saved) | {"grid", *STATISTICS}
    entries = _shown(run, run.summary, all_combinations) or [{}]
    table += [{"run": run.name, **values,
               **{k: v for k, v in entry.items() if not narrow or k in kept}}
              for entry in entries]
  return table


def _metrics(run: Run) -> list[str]:
  """The metric columns of the run's metrics.csv that have a value, in its order: those
  that are neither the run's own columns (algorithm, seed, round, grid, divergence) nor
  its settings (`_settings`)."""
  other = set(RUN_COLUMNS) | set(_settings(run))
  return [c for c in run.columns if c not in other and any(r[c] != "" for r in run.rows)]


def _settings(run: Run) -> list[str]:
  """The metrics.csv columns that hold a setting of the run (`_setting_names`, e.g.
  num_clients of fedrep-fig3, whose figure draws a panel per value), but the run's own
  columns (RUN_COLUMNS)."""
  names = _setting_names(run.saved)
  return [c for c in run.columns if c in names and c not in RUN_COLUMNS]


def _curve_rounds(run: Run, metric: str) -> int:
  """How many distinct rounds the run has a value of `metric` at."""
  return len({r["round"] for r in run.rows if r.get(metric, "") != ""})


def choose_metric(runs: list[Run], metric: str | None = None) -> str:
  """The metric to draw.

  Args:
    runs: the runs to compare.
    metric: the metric asked for (--metric), or None for the default.

  Returns:
    `metric`, where every run's metrics.csv has a value of it; by default the first of
    METRICS that every run has at two rounds or more, else the first metric of the first
    run that all have so. Raises a ConfigError naming the metrics every run has where
    `metric` is not one of them, or where there is no default.
  """
  available = [_metrics(run) for run in runs]
  common = [m for m in available[0] if all(m in other for other in available[1:])]
  if metric is not None:
    for run, metrics in zip(runs, available):
      if metric not in metrics:
        raise cfg.ConfigError(f"--metric {metric} is not a metric of {run.name} (its metrics: "
                              f"{', '.join(metrics) or 'none'}); metrics of every run: "
                              f"{', '.join(common) or 'none'}")
    return metric
  curves = [m for m in common if all(_curve_rounds(run, m) >= 2 for run in runs)]
  for name in [*METRICS, *curves]:
    if name in curves:
      return name
  raise cfg.ConfigError(f"the runs have no metric in common that they have at two rounds or "
                        f"more (metrics of every run: {', '.join(common) or 'none'}): give "
                        f"--metric NAME")


def _panel(run: Run, row: dict) -> str:
  """The figure panel of a metrics.csv row: its algorithm's label (`labels.label`), or the
  run's recipe where the row has no algorithm."""
  return labels.label(row["algorithm"]) if row.get("algorithm", "") != "" else \
      run.saved.get("recipe", "")


def _series(run: Run, metric: str, all_combinations: bool) -> dict:
  """{(panel, grid label, settings text): rows} of the rows that compare shows (`_shown`)
  that have a value of `metric`, in their order: one line each in the figure (panel:
  `_panel`; settings text: 'KEY=VALUE, ...' of the run's `_settings` columns that take
  several values, e.g. 'num_clients=100', but the grid's keys, which its label names)."""
  grid = run.saved.get("grid") or {}
  rows = [row for row in _shown(run, run.rows, all_combinations) if row.get(metric, "") != ""]
  settings = [key for key in _settings(run) if key not in grid
              and len({r[key] for r in rows if r[key] != ""}) > 1]
  series = {}
  for row in rows:
    shown = ", ".join(f"{key}={row[key]}" for key in settings if row[key] != "")
    series.setdefault((_panel(run, row), row.get("grid", ""), shown), []).append(row)
  return series


def _run_label(run: Run, keys: list[str], most: int = 40) -> str:
  """The run's name in the legend: the directory as given, followed by its values of the
  differing `keys` ('/runs/b (lr=0.1)') where they take at most `most` characters."""
  flat = flat_config(run.saved)
  values = ", ".join(f"{key}={cfg.setting_text(flat[key]) if key in flat else '-'}"
                     for key in keys)
  return f"{run.name} ({values})" if values and len(values) <= most else run.name


def plot(runs: list[Run], metric: str, keys: list[str], file,
         all_combinations: bool = False) -> None:
  """Draws one figure of every run's curves of `metric` and writes it as PNG.

  A panel per algorithm (`_panel`: the algorithms of all runs in first-seen order, a run
  without an algorithm column one panel named by its recipe), titled by it; in each, the
  mean over seeds against round (with its min-max band, as the recipes' figures draw it)
  of each run's rows of that algorithm that compare shows (`_series`: of a grid by default
  the chosen combination, with all_combinations every one; a line per combination and
  setting), over the rounds that have a value of the metric. A hue per run (10 hues), a
  line style per line of the run in the panel, its shade light from the fifth line on
  (after the 4 line styles); one legend below names each line's run (with its values of
  `keys` where they are short), algorithm, setting and grid combination. A log y axis in
  a panel whose values are positive and span over two decades.

  Args:
    runs: the runs to compare.
    metric: a metric every run has (`choose_metric`).
    keys: the configuration keys that differ between the runs (for the title).
    file: a path or binary file to write the PNG to.
    all_combinations: draw every combination of a grid, not only the chosen ones.

  Returns:
    None.
  """
  from matplotlib import colormaps  # loaded with the figure
  series = [_series(run, metric, all_combinations) for run in runs]
  panels = list(dict.fromkeys(panel for each in series for panel, _, _ in each))
  one = len(panels) == 1
  fig, axes = plotting.grid_of(len(panels), width=8 if one else 5.2, height=4.8 if one else 3.8)
  shades = colormaps["tab20"].colors  # a dark and a light shade of each of 10 hues
  for ax, panel in zip(axes, panels):
    values = []
    for i, (run, each) in enumerate(zip(runs, series)):
      lines = [(shown, rows) for (name, _, shown), rows in each.items() if name == panel]
      for j, (shown, rows) in enumerate(lines):
        label = f"{_run_label(run, keys)}: {panel}" + (f", {shown}" if shown else "")
        light, ls = divmod(j, len(plotting.LINESTYLES))
        style = {"color": shades[(2 * i + light % 2) % len(shades)],
                 "ls": plotting.LINESTYLES[ls]}
        plotting.line(ax, rows, "round", metric, label, style=style)
        values += [r[metric] for r in rows if isinstance(r[metric], (int, float))]
    finite = [v for v in values if math.isfinite(v)]
    if finite and min(finite) > 0 and max(finite) > 100 * min(finite):
      ax.set_yscale("log")
    ax.set(title=panel, xlabel="round", ylabel=metric)
  differ = (f"differing in {', '.join(keys)}" if 0 < len(keys) <= 6 else
            f"differing in {len(keys)} keys" if keys else "of equal configurations")
  grids = [run for run in runs if run.saved.get("grid")]
  chosen = ("" if not grids else "; of a grid, every combination" if all_combinations else
           "; of a grid, each algorithm's combination chosen on validation"
           + (" (every one where there is no choice)" if any(choice(run) is None
                                                           for run in grids) else ""))
  fig.suptitle(f"{metric}, mean over seeds: {len(runs)} runs {differ}, a colour per run"
               f"{chosen}")
  plotting.save(fig, file)


@dataclasses.dataclass(frozen=True)
class Comparison:
  """What `compare` found and wrote.

  Attributes:
    keys: the configuration keys that differ between the runs (`differing_keys`).
    table: the side-by-side summary table (`summary_rows`) as CSV text, as printed.
    metric: the metric the figure draws.
    written: the files written (the figure, then the CSV file where asked).
  """
  keys: list
  table: str
  metric: str
  written: list


def compare(paths, *, csv_path: str | None = None, figure_path: str = "compare.png",
            metric: str | None = None, all_combinations: bool = False) -> Comparison:
  """Compares run directories: their differing keys, summaries side by side, one figure.

  Every directory and the metric are checked before anything is written; each file is
  written atomically (`files.atomic_write`). Of a run with a grid, only each algorithm's
  chosen combination (`choice`) is drawn and tabulated unless all_combinations; where a
  run has a grid but no choice, one line on stderr says so and all are.

  Args:
    paths: two run directories or more (`fedjax-rep run --out`).
    csv_path: where to write the side-by-side table as CSV, with every summary column
      (None: nowhere).
    figure_path: where to write the figure (PNG; `plot`).
    metric: the metric to draw (None: `choose_metric`'s default).
    all_combinations: draw and tabulate every combination of a grid (`fedjax-rep compare
      --all`).

  Returns:
    The Comparison. Raises a ConfigError as `read_runs` and `choose_metric` do, and a
    files.WriteError when a file cannot be written.
  """
  runs = read_runs(paths)
  metric = choose_metric(runs, metric)
  keys = differing_keys(runs)
  for run in runs:
    if not all_combinations and run.saved.get("grid") and choice(run) is None:
      print(f"fedjax-rep: {run.name} has a grid but no validation-based choice among its "
            f"combinations (no selection.csv, no val_accuracy in its summary): showing "
            f"every one; run it with --select to choose one per algorithm", file=sys.stderr)
  first = ("run", *keys)
  text = csv_tables.csv_text(summary_rows(runs, keys, all_combinations), first=first)
  written = [figure_path]
  files.atomic_write(figure_path, lambda f: plot(runs, metric, keys, f, all_combinations))
  if csv_path is not None:
    every = csv_tables.csv_text(summary_rows(runs, keys, all_combinations, every_column=True),
                                first=first)
    files.atomic_write(csv_path, lambda f: f.write(every.encode()))
    written.append(csv_path)
  return Comparison(keys, text, metric, written)
