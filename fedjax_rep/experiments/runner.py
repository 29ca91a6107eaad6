"""Running a recipe: over a grid of settings, in memory (`run`) or into a run directory
(`run_to_dir`: metrics.csv, config.json, the figure, checkpoints), and again from a
config.json (`replay`).

A run covers every combination of its grid (`--grid KEY=V1,V2,...`, or grid={KEY: values}):
keys that the recipe declares `traced` are swept inside one call of its run function (one
compiled program per shape), the other (shape-changing) keys by one call per combination.
Every swept key is a column of the rows, and so is `grid`, the label of the row's
combination ("lr=0.3, num_clients=100"); figures draw one line per label.
"""

import contextlib
import dataclasses
import datetime
import json
import os
import sys

import jax

from fedjax_rep.core import checkpoint
from fedjax_rep.core import distributed
from fedjax_rep.core import files
from fedjax_rep.core import threefry
from fedjax_rep.experiments import batch as batch_lib
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import outputs
from fedjax_rep.experiments import placement
from fedjax_rep.experiments import plotting
from fedjax_rep.experiments import plugins as plugins_lib
from fedjax_rep.experiments import recipe_registry
from fedjax_rep.experiments import sampling
from fedjax_rep.experiments import search as search_lib
from fedjax_rep.experiments import selection
from fedjax_rep.experiments import tracking


def check_seeds(seeds) -> int:
  if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
    raise cfg.ConfigError(f"--seeds must be an integer >= 1, got {seeds!r}")
  return seeds


def _prepare(name, quick, seeds, overrides, grid, sample=(), trials=None):
  """(recipe, validated config, number of seeds, its checked `cfg.Sweep` of `grid` and of
  `trials` points drawn from the --sample items `sample` (`sampling`)): every check,
  before any work."""
  recipe = recipe_registry.get(name)
  config = recipe_registry.resolve(name, quick=quick, overrides=overrides)
  swept = cfg.sweep(config, grid, overrides, _samples(recipe, config, sample, trials))
  for each in swept.configs:
    placement.check(each)
    if each.private() and not recipe.privacy:
      able = sorted(r.name for r in recipe_registry.all_recipes().values() if r.privacy)
      raise cfg.ConfigError(f"{name} does not run user-level DP (dp_epsilon, dp_noise, "
                            f"dp_clip); the recipes that do: {', '.join(able)}")
  return recipe, config, check_seeds(recipe.default_seeds if seeds is None else seeds), swept


def _samples(recipe, config, sample, trials) -> list[dict]:
  """The `trials` points drawn from the --sample items `sample` (`sampling.draw`, from
  config's seed); ConfigError where a key is sampled twice or is not one the recipe
  sweeps in one program (`Recipe.traced`)."""
  distributions = {}
  for item in sample:
    key, distribution = sampling.parse(config, item)
    if key in distributions:
      raise cfg.ConfigError(f"--sample {key} is given twice: give one distribution per key")
    distributions[key] = distribution
  sampling.check_trials(trials, bool(distributions))
  traced = recipe.traced(config) if callable(recipe.traced) else recipe.traced
  for key in distributions:
    if key not in traced:
      raise cfg.ConfigError(f"--sample {key}: {recipe.name} draws candidates only of the keys "
                            f"it sweeps in one program ({', '.join(traced) or 'none'}); give "
                            f"{key} in --grid instead")
  return sampling.draw(distributions, trials, config.seed) if distributions else []


def _label(row: dict, shape: dict, keys) -> str:
  """The `grid` label of a row (or a search record) of the combination `shape` of the
  shape-changing keys: the swept `keys` at the shape's values, else the row's."""
  return cfg.combination_label({key: shape[key] if key in shape else row.get(key)
                                for key in keys})


def _sweep(recipe, config, seeds, swept, batch) -> list[dict]:
  """The rows of every combination of the sweep `swept`: one call of recipe.run per
  combination of the shape-changing keys (with grid=[traced combinations] where the recipe
  traces swept keys), each caching its units under the prefix 'KEY=VALUE,...--'; every row
  gets the swept keys and the `grid` label of its combination as columns. Without a grid:
  recipe.run's rows. Each call runs its runs through `batch` (`batch_lib.Batch`: units,
  checkpoints, progress, tracker). First says on stderr which combinations train on mock
  data (`mock_lines`). With a tracker (batch.tracker), its rows' metrics are logged to it
  (those not logged as they ran). With a search (batch.search), its records get the shape's
  keys and their `grid` labels."""
  if distributed.is_writer():
    for line in mock_lines(recipe, swept.configs):
      print(line, file=sys.stderr)
  tracker = batch.tracker
  if not swept.values:
    rows = recipe.run(config, seeds, batch)
    _track(tracker, recipe, rows)
    return rows
  traced_keys = recipe.traced(config) if callable(recipe.traced) else recipe.traced
  traced, shapes = swept.split(traced_keys)
  traced_grid = {} if traced is None else {"grid": traced}
  combinations = dict(zip(swept.labels, swept.combinations))
  rows = []
  for shape in shapes:
    prefix = cfg.combination_label(shape, ",") + "--" if shape else ""
    if tracker is not None:
      tracker.combination = shape
    records = [] if batch.search is None else batch.search.records
    first = len(records)
    if batch.search is not None:
      batch.search.columns = shape
    shape_rows = recipe.run(cfg.apply(config, shape), seeds, batch.prefixed(prefix),
                            **traced_grid)
    for record in records[first:]:
      record["grid"] = _label(record, shape, swept.values)
    start = len(rows)
    for row in shape_rows:
      label = _label(row, shape, swept.values)
      if label not in combinations:
        swept_traced = ", ".join(key for key in swept.values if key in traced_keys)
        raise RuntimeError(f"recipe {recipe.name} returned a row of {label}, which is not a "
                           f"combination of its grid; its run must return the traced keys "
                           f"{swept_traced} as columns with the values it was given")
      rows.append({**row, **combinations[label], "grid": label})
    _track(tracker, recipe, rows[start:])
  return rows


def _track(tracker, recipe, rows: list[dict]) -> None:
  """Logs the metrics.csv columns of `rows` (not recipe.summary_only) to `tracker`, if
  any."""
  if tracker is not None:
    tracker.rows([{k: v for k, v in row.items() if k not in recipe.summary_only}
                  for row in rows])


def _tracker(log, path, name, swept, fresh):
  """The `tracking.Tracker` of sinks `log` in `path` for recipe `name`'s run over the
  sweep `swept` (process 0 of a job only; a context manager that closes it), or a context of
  None without sinks."""
  if not log or not distributed.is_writer():
    return contextlib.nullcontext()
  return tracking.Tracker(path, log, recipe=name, grid=swept.values, fresh=fresh)


def mock_lines(recipe, configs) -> list[str]:
  """One line for each different mock data (`Recipe.mock_data`) that the configurations
  `configs` (those of a sweep's combinations) train on, e.g. "fedjax-rep:
  fedrep-table1-cifar10 runs on mock data (random examples in the format of CIFAR-10),
  not the real dataset (source=mock, as --quick sets): its numbers mean nothing;
  `fedjax-rep data` says how to get the data"."""
  if recipe.mock_data is None:
    return []
  mocks = dict.fromkeys(map(recipe.mock_data, configs))
  return [f"fedjax-rep: {recipe.name} runs on mock data ({mock}), not the real dataset "
          f"(source=mock, as --quick sets): its numbers mean nothing; `fedjax-rep data` says "
          f"how to get the data" for mock in mocks if mock is not None]


def _figure_config(config, swept: cfg.Sweep):
  """`config` as the figure sees the rows: each swept sequence field holds all its swept
  values (e.g. fedrep-fig3's panels, one per num_clients); other fields (and options)
  are unchanged."""
  known = cfg.fields(type(config))
  return dataclasses.replace(config, **{
      key: values for key, values in swept.grid.items()
      if key in known and known[key].metadata["check"].sequence})


def run(name: str, *, quick: bool = False, seeds: int | None = None, overrides=(), grid=(),
        progress: bool = True, log=(), log_dir: str | None = None
        ) -> tuple[list[dict], object]:
  """Runs recipe `name` in memory over every combination of `grid`.

  Each combination as `_sweep` runs it; writes no files, and prints one line on stderr per
  diverged run (`diverged_lines`) at the end.

  Args:
    name: a recipe's name (`fedjax-rep list`).
    quick: apply the recipe's --quick settings.
    seeds: runs per algorithm and setting (default: the recipe's `default_seeds`).
    overrides: 'KEY=VALUE' items, as `--set` takes them.
    grid: {KEY: values} or 'KEY=V1,V2,...' items, as `--grid` takes them.
    progress: show a progress bar.
    log: trackers to log the runs to as they compute, 'tensorboard' and/or 'mlflow'
      (`tracking`; needs `pip install '.[tracking]'`).
    log_dir: where the trackers write (a new directory, or one without their logs;
      default runs/NAME-<date>-<time>).

  Returns:
    (rows, config): the metrics.csv rows (dicts, one per algorithm x seed x round x
    combination) and the resolved configuration, where a swept sequence field holds all its
    swept values.
  """
  recipe, config, seeds, swept = _prepare(name, quick, seeds, overrides, grid)
  log = tracking.check(log)
  log_dir = default_out(name) if log_dir is None else log_dir
  if log:
    tracking.check_new(log_dir)
  with _tracker(log, log_dir, name, swept, fresh=False) as tracker:
    rows = _sweep(recipe, config, seeds, swept, batch_lib.Batch(progress=progress,
                                                                tracker=tracker))
    if tracker is not None:
      tracker.finish(_summary(recipe, rows, config, swept) if recipe.summarize else [])
  _say_diverged(rows)
  return rows, _figure_config(config, swept)


def _summary(recipe, rows, config, swept: cfg.Sweep) -> list[dict]:
  """recipe.summarize of each combination of the sweep `swept` (its rows, its
  configuration), the combination's swept keys and `grid` label added to each entry;
  without a grid, that of all rows."""
  if not swept.values:
    return recipe.summarize(rows, config)
  table = []
  for combination, label, each in zip(swept.combinations, swept.labels, swept.configs):
    entries = recipe.summarize([r for r in rows if r["grid"] == label], each)
    table += [{**entry, **combination, "grid": label} for entry in entries]
  return table


def run_to_dir(name: str, *, quick: bool = False, seeds: int | None = None, overrides=(),
               grid=(), out: str | None = None, progress: bool = True, overwrite: bool = False,
               checkpoint_rounds: int | None = None,
               checkpoint_seconds: float | None = checkpoint.DEFAULT_SECONDS,
               plugins=(), select: bool = False, confirm_seeds: int | None = None,
               log=(), stop=checkpoint.never, search: str | None = None,
               eta: int = search_lib.DEFAULT_ETA, min_rounds: int | None = None, sample=(),
               trials: int | None = None) -> str:
  """Runs recipe `name` over every combination of `grid` into a run directory.

  It writes metrics.csv, config.json (the grid, the code's revision, the plugins),
  NAME.png (with `select`: of each algorithm's and setting's chosen combination), and the
  recipe's summary table (e.g. table1.csv) where it has one.

  Finished units are saved under out/parts and a unit's runs checkpoint as they go, so
  running again with the same `out`, configuration and grid (e.g. `replay(out/config.json)`)
  resumes instead of starting over. `out` must be new, empty or such a run
  (`outputs.RunDir`), and no other process may be writing it (`outputs.InUse`: this process
  holds its lock until it returns). Prints one line on stderr per diverged run at the end.

  Args:
    name, quick, seeds, overrides, grid, progress: as `run`.
    out: the run directory (default runs/NAME-<date>-<time>).
    overwrite: start a run in `out` over instead of resuming it.
    checkpoint_rounds: checkpoint a unit's runs every this many rounds (None: by time only).
    checkpoint_seconds: checkpoint every this many seconds (None: by rounds only).
    plugins: paths of Python files that register algorithms, imported first
      (`plugins.load_all`).
    select: also choose, per algorithm, the grid's combination of the best validation
      statistic (`selection`; needs validation_fraction > 0) and write selection.csv and
      selection.png.
    confirm_seeds: with select, run each choice again on this many fresh seeds (those after
      the run's) and add its test statistic there to selection.csv.
    log: as `run`'s, writing into the run directory (out/tensorboard, out/mlflow.db);
      recorded in config.json, and a resumed run adds only the rounds its logs lack.
    stop: stop() -> the name of a signal that asked the run to stop, or None
      (`core.checkpoint.Signals.requested`): the running unit then checkpoints and raises
      `checkpoint.Interrupted`.
    search: 'halving' or 'hyperband': stop the candidates (the grid's traced combinations,
      or the sampled points) early by validation (`search`), and select as `select` does;
      also writes search.csv (every setting's rungs) and search.png, and selection.csv
      gets the rung each choice reached.
    eta, min_rounds: the search's 1/eta that continue after a rung and its shortest rung
      (None: eval_every).
    sample: --sample items 'KEY=DIST' (`sampling`): candidates drawn from ranges, `trials`
      of them, with each combination of `grid`.

  Returns:
    The run directory.
  """
  loaded = plugins_lib.load_all(plugins)
  recipe, config, seeds, swept = _prepare(name, quick, seeds, overrides, grid, sample, trials)
  log = tracking.check(log)
  grid = swept.values
  searching = None
  if search is not None:
    searching = _search(recipe, config, swept, search, eta, min_rounds)
    select = True
  if select or confirm_seeds is not None:
    if not select:
      raise cfg.ConfigError("--confirm-seeds reruns the combinations that --select chooses: "
                            "give --select too")
    selection.check(config, swept, confirm_seeds)
  try:
    checkpoint.check_policy(checkpoint_rounds, checkpoint_seconds)
  except ValueError as error:
    raise cfg.ConfigError(str(error)) from None
  out = default_out(name) if out is None else out
  with outputs.RunDir(
      out, {"recipe": name, "quick": quick, "seeds": seeds,
            "config": cfg.saved(config), "grid": swept.grid,
            **_sample_record(sample, trials, swept),
            **({"search": searching.record()} if searching else {}),
            "code": {"revision": files.revision(), "source": files.source_fingerprint(),
                     **config.code_record(),
                     "threefry": "flat" if threefry.flat() else "jax",
                     "threefry_scope": "process"},
            "job": job_record(config), "plugins": loaded,
            **({"select": {"confirm_seeds": confirm_seeds}} if select else {}),
            **({"log": list(log)} if log else {}),
            **config.record(swept),
            "versions": outputs.versions()},
      overwrite=overwrite, every_rounds=checkpoint_rounds,
      every_seconds=checkpoint_seconds, stop=stop) as run_dir, _tracker(
          log, out, name, swept, fresh=overwrite) as tracker:
    plotting.prefetch()  # the figure's library loads while the rounds run
    batch = batch_lib.Batch(unit=run_dir.unit, checkpoints=run_dir.checkpoints,
                            progress=progress, tracker=tracker, search=searching)
    rows = _sweep(recipe, config, seeds, swept, batch)
    columns = (*grid, "grid") if grid else ()
    run_dir.write_csv("metrics.csv", [{k: v for k, v in row.items()
                                       if k not in recipe.summary_only} for row in rows],
                      first=("algorithm", "seed", "round", *columns))
    written = ["config.json", "metrics.csv"]
    entries = [] if recipe.summarize is None else _summary(recipe, rows, config, swept)
    if recipe.summarize is not None:
      run_dir.write_csv(recipe.summary_file, entries, first=("algorithm", *columns))
      written.append(recipe.summary_file)
    figure_rows = rows
    if select:
      chosen = selection.choose(entries, grid)
      for line in selection.edge_lines(chosen, grid):
        print(line, file=sys.stderr)
      if confirm_seeds:
        chosen = selection.confirmed(chosen, _confirm(recipe, config, seeds, grid, chosen,
                                                      confirm_seeds, batch),
                                     grid, confirm_seeds)
      keys = selection.setting_keys(chosen, grid)
      figure_rows = selection.chosen_rows(rows, chosen, keys)
      if searching is not None:
        chosen = search_lib.selection_columns(chosen, searching.records, keys)
        run_dir.write_csv("search.csv", searching.records, first=(*keys, *grid, "grid"))
        run_dir.write("search.png", lambda f: search_lib.plot(rows, searching.records,
                                                              chosen, keys, f))
        written += ["search.csv", "search.png"]
      run_dir.write_csv("selection.csv", chosen, first=keys)
      run_dir.write("selection.png", lambda f: selection.plot(entries, chosen, grid, f))
      written += ["selection.csv", "selection.png"]
    run_dir.write(f"{name}.png", lambda f: recipe.plot(figure_rows,
                                                       _figure_config(config, swept), f))
    written.append(f"{name}.png")
    if tracker is not None:
      tracker.finish(entries)
    run_dir.finish(written)
    _say_diverged(rows)
  return out


def _search(recipe, config, swept: cfg.Sweep, method, eta, min_rounds) -> search_lib.Search:
  """The checked `search.Search` of `method` over the candidates of `swept` (its traced
  combinations: the recipe's `traced` keys, every point of --sample); ConfigError (one
  line) where there are none or `search.check` refuses."""
  traced_keys = recipe.traced(config) if callable(recipe.traced) else recipe.traced
  candidates, _ = swept.split(traced_keys)
  if not candidates:
    raise cfg.ConfigError(f"--search stops candidates early: give them as --grid values of "
                          f"keys {recipe.name} sweeps in one program "
                          f"({', '.join(traced_keys) or 'none'}) or as --sample KEY=DIST "
                          f"--trials N")
  search_lib.check(method, eta, min_rounds, swept.configs, len(candidates),
                   recipe.searchable)
  return search_lib.Search(method, eta, min_rounds, seed=config.seed)


def _sample_record(sample, trials, swept: cfg.Sweep) -> dict:
  """What config.json records of --sample: {"sample": {"keys": {KEY: DIST}, "trials": N,
  "design": ..., "points": [...]}}, or {} without."""
  if not sample:
    return {}
  keys = {item.partition("=")[0].strip(): item.partition("=")[2] for item in sample}
  return {"sample": {"keys": keys, "trials": trials, "design": sampling.DESIGN,
                     "points": list(swept.samples)}}


def _confirm(recipe, config, seeds: int, grid: dict, chosen: list[dict], confirm_seeds: int,
             batch) -> list[dict]:
  """The summary entries (with the swept keys) of the chosen combinations (`selection.choose`'s
  rows) run again on `confirm_seeds` fresh seeds, those after the run's `seeds`: one run
  of the recipe per combination, of the algorithms that chose it where the recipe has
  `algorithms`; units 'confirm-KEY=VALUE,...--'."""
  runs = {}
  for row in chosen:
    combination = {key: row[key] for key in grid}
    label = cfg.combination_label(combination, ",")
    runs.setdefault(label, (combination, {}))[1][row["algorithm"]] = None
  entries = []
  for label, (combination, names) in runs.items():
    fresh = dataclasses.replace(cfg.apply(config, combination), seed=config.seed + seeds)
    if config.algorithms:
      fresh = dataclasses.replace(fresh, algorithms=tuple(names))
    rows = recipe.run(fresh, confirm_seeds,
                      dataclasses.replace(batch.prefixed(f"confirm-{label}--"), tracker=None))
    entries += [{**entry, **combination}
                for entry in recipe.summarize([{**r, **combination} for r in rows], fresh)]
  return entries


def _say_diverged(rows: list[dict]) -> None:
  """Prints `diverged_lines` of `rows` on stderr (process 0 of a job)."""
  if distributed.is_writer():
    for line in diverged_lines(rows):
      print(line, file=sys.stderr)


def diverged_lines(rows: list[dict]) -> list[str]:
  """One line per diverged run of `rows` (metrics.csv rows), in their order: its
  algorithm, seed, setting (the columns that `shared.round_rows` puts between `round` and
  `diverged_round`, but those that the `grid` label names, then that label) and the round
  at which it diverged, e.g. 'fedjax-rep: fedrep seed 0 (grid lr=0.5) diverged at round 1;
  its metrics are NaN from then on'."""
  lines = []
  for row in rows:
    if not row.get("diverged_round") or row.get("round") != row["diverged_round"]:
      continue  # one row per diverged run: that of its diverged round
    columns, grid = list(row), row.get("grid")
    in_grid = {part.split("=")[0] for part in grid.split(", ")} if grid else set()
    setting = [f"{key}={row[key]}" for key in
               columns[columns.index("round") + 1:columns.index("diverged_round")]
               if key not in in_grid] + ([f"grid {grid}"] if grid else [])
    lines.append(f"fedjax-rep: {row['algorithm']} seed {row['seed']}"
                 + (f" ({', '.join(setting)})" if setting else "")
                 + f" diverged at round {row['round']}; its metrics are NaN from then on")
  return lines


def job_record(config) -> dict:
  """What config.json records of where the run ran: its processes and the devices its
  client axis was split over (not compared on resume: with the cohort groups fixed, the
  numbers do not depend on them)."""
  return {"processes": jax.process_count(), "devices": placement.device_count(config)}


def default_out(name: str) -> str:
  """runs/NAME-<date>-<time>: where a run of recipe `name` started now writes by default."""
  return os.path.join("runs", f"{name}-{datetime.datetime.now():%Y%m%d-%H%M%S}")


def _saved_items(saved_config: dict, grid: dict) -> list[str]:
  """The --set items of a config.json's configuration: each field but those `grid` sweeps,
  and each option of its `options` as NAME=VALUE."""
  items = [f"{key}={cfg.setting_text(value)}" for key, value in saved_config.items()
           if key not in grid and key != "options"]
  return items + [f"{key}={value!r}" for key, value in saved_config.get("options", ())]


def replay(config_path: str) -> dict:
  """The keywords of `run_to_dir` (name, quick, seeds, overrides, grid, log, plugins, select,
  confirm_seeds, search, eta, min_rounds, sample, trials) that run
  again the run that wrote `config_path` (its config.json): every configuration field as a
  --set item, checked as any, and the plugins it ran with. ConfigError when the file
  cannot be read or names no recipe; PluginError when a plugin is missing or changed."""
  try:
    with open(config_path) as f:
      saved = json.load(f)
  except OSError as error:
    raise cfg.ConfigError(f"cannot read {config_path} ({error.strerror}): give the "
                          f"config.json of a run directory") from None
  except ValueError as error:
    raise cfg.ConfigError(f"{config_path} is not a run's config.json ({error})") from None
  if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict):
    raise cfg.ConfigError(f"{config_path} is not a run's config.json (no 'config' entry)")
  name = saved.get("recipe")
  try:
    recipe_registry.get(name)
  except cfg.ConfigError:
    raise cfg.ConfigError(f"{config_path} names recipe {name!r}, which is not one of "
                          f"{', '.join(recipe_registry.all_recipes())}") from None
  grid = saved.get("grid") or {}
  select = saved.get("select")
  searched = saved.get("search") or {}
  sampled = saved.get("sample") or {}
  return {"name": name, "quick": bool(saved.get("quick")), "seeds": saved.get("seeds"),
          "search": searched.get("method"),
          "eta": searched.get("eta", search_lib.DEFAULT_ETA),
          "min_rounds": searched.get("min_rounds"),
          "sample": tuple(f"{k}={v}" for k, v in sampled.get("keys", {}).items()),
          "trials": sampled.get("trials"),
          "select": select is not None,
          "confirm_seeds": select.get("confirm_seeds") if isinstance(select, dict) else None,
          "overrides": _saved_items(saved["config"], {**grid, **sampled.get("keys", {})}),
          "grid": {key: tuple(values) for key, values in grid.items()},
          "log": tuple(saved.get("log") or ()),
          "plugins": plugins_lib.recorded(saved.get("plugins"), config_path)}
