"""Runs in the trackers researchers use: TensorBoard event files (DIR/tensorboard) and an
MLflow store (DIR/mlflow.db) in a run directory, one tracked run per algorithm x seed x
setting x grid combination. A `Tracker` logs the rounds as `loop.run` computes them (`live`,
a callback of the runs whose callers name them) and completes them from metrics.csv's rows
(`rows`); each (run, metric, round) is logged once, across resumes too, as each sink reads
back what it holds when it opens. At the end it adds the summary table's entries as
`summary/NAME` metrics, and the settings as TensorBoard HParams and MLflow params.
"""

import contextlib
import functools
import glob
import importlib.util
import logging
import math
import os
import queue
import shutil
import threading
import time

import numpy as np

from fedjax_rep.experiments import config as cfg

INSTALL = "pip install '.[tracking]' in fedjax_rep's checkout"
# Each sink's libraries: tensorboardX writes the event files, tensorboard reads them back
# (and shows them); MLflow's sqlite store needs sqlalchemy and alembic.
LIBRARIES = {"tensorboard": ("tensorboardX", "tensorboard"),
             "mlflow": ("mlflow", "sqlalchemy", "alembic")}
SUMMARY = "summary/"  # the prefix of the summary table's metrics
# The logs reach the files at most this many seconds after the rounds are computed (and at
# the end): TensorBoard's writers flush, MLflow receives its batches, this often.
SECONDS = 2.0


def check(log) -> tuple[str, ...]:
  """The sinks of `log` (a name of LIBRARIES, or a sequence of them) as a tuple, in order;
  ConfigError for an unknown or repeated name, or a sink whose libraries are not installed
  (saying how to install them). Imports nothing."""
  names = (log,) if isinstance(log, str) else tuple(log or ())
  for name in names:
    if name not in LIBRARIES:
      raise cfg.ConfigError(f"--log {name!r} is not a tracker: choose from "
                            f"{', '.join(LIBRARIES)} (repeat --log for both)")
  if len(set(names)) < len(names):
    raise cfg.ConfigError(f"--log names a tracker twice ({', '.join(names)}): give each once")
  for name in names:
    missing = [m for m in LIBRARIES[name] if importlib.util.find_spec(m) is None]
    if missing:
      raise cfg.ConfigError(f"--log {name} needs {', '.join(missing)}, which is not "
                            f"installed: {INSTALL}")
  return names


def _number(value) -> float | None:
  """`value` as a float where it is a number (not a bool, not text), else None."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
    return None
  return float(value)


def _hparam(value):
  """`value` as a TensorBoard HParams value: a bool, a finite float, or text (e.g. 'nan')."""
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  number = _number(value)
  return number if number is not None and math.isfinite(number) else str(value)


class TensorBoard:
  """Event files under DIR/tensorboard: run NAME in DIR/tensorboard/NAME, the HParams
  experiment in DIR/tensorboard itself (tensorboardX's EventsWriter, written by the
  tracker's thread)."""

  def __init__(self, path: str):
    self.path, self.writers, self.written = os.path.join(path, "tensorboard"), {}, set()
    self.logged = {}  # {run name: {(tag, step)}} already in the files
    self.sessions = set()  # the runs whose files hold their HParams already
    for folder, _, names in os.walk(self.path):
      if folder != self.path and any(".tfevents." in n for n in names):
        from tensorboard.backend.event_processing import event_accumulator
        events = event_accumulator.EventAccumulator(
            folder, size_guidance={event_accumulator.SCALARS: 0}, purge_orphaned_data=False)
        events.Reload()
        name = os.path.relpath(folder, self.path)
        self.logged[name] = {(tag, event.step) for tag in events.Tags()["scalars"]
                             for event in events.Scalars(tag)}
        with contextlib.suppress(KeyError):  # KeyError: no HParams in the files
          events.PluginTagToContent("hparams")
          self.sessions.add(name)

  def _write(self, name: str, summary, step: int = 0) -> None:
    """Writes the Summary proto `summary` at `step` into run `name` ('' for DIR/tensorboard)
    in a file of this tracker's own (events.out.tfevents.SECONDS.HOST.NANOSECONDS: another
    than a resumed run's, even within its second)."""
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto.event_pb2 import Event
    if name not in self.writers:
      folder = os.path.join(self.path, name)
      os.makedirs(folder, exist_ok=True)
      self.writers[name] = EventsWriter(os.path.join(folder, "events"), f".{time.time_ns()}")
    self.writers[name].write_event(Event(wall_time=time.time(), step=step, summary=summary))
    self.written.add(name)

  def log(self, name: str, settings: dict, values: list[tuple]) -> None:
    """Writes `values` [(tag, step, value)] into run `name` (`settings` unused here): one
    event per step, holding its scalars."""
    from tensorboardX.proto.summary_pb2 import Summary
    del settings
    steps = {}
    for tag, step, value in values:
      steps.setdefault(step, []).append(Summary.Value(tag=tag, simple_value=value))
    for step, scalars in steps.items():
      self._write(name, Summary(value=scalars), step)

  def flush(self) -> None:
    """Flushes the files written since the last flush."""
    for name in self.written:
      self.writers[name].flush()
    self.written = set()

  def finish(self, settings: dict[str, dict], metrics: list[str]) -> None:
    """The HParams plugin's summaries: each run's `settings[name]` (its session), and the
    experiment (every setting's values, the `metrics` tags) in DIR/tensorboard."""
    from tensorboardX.summary import hparams
    for name, values in settings.items():
      if name not in self.sessions:
        self.sessions.add(name)
        _, start, end = hparams({k: _hparam(v) for k, v in values.items()}, {})
        self._write(name, start)
        self._write(name, end)
    keys = {key: _hparam(value) for values in settings.values() for key, value in values.items()}
    experiment, _, _ = hparams(keys, dict.fromkeys(metrics, 0.0))
    for stale in glob.glob(os.path.join(self.path, "*.tfevents.*")):
      os.unlink(stale)  # the experiment of an earlier finish: this one lists every run
    self._write("", experiment)

  def close(self) -> None:
    for writer in self.writers.values():
      writer.close()
    self.writers = {}


class MLflow:
  """An MLflow store in DIR/mlflow.db (sqlite), experiment `experiment`: run NAME has the
  run name and tag `fedjax_rep.run` NAME, its settings as params; values are sent at each
  `flush`."""

  def __init__(self, path: str, experiment: str):
    from mlflow.tracking import MlflowClient
    for name in ("mlflow", "alembic"):  # their set-up lines on stderr
      logging.getLogger(name).setLevel(logging.WARNING)
    self.uri = "sqlite:///" + os.path.abspath(os.path.join(path, "mlflow.db"))
    self.client = MlflowClient(tracking_uri=self.uri)
    found = self.client.get_experiment_by_name(experiment)
    self.experiment = (found.experiment_id if found
                       else self.client.create_experiment(experiment))
    self.runs, self.logged, self.pending = {}, {}, {}
    for run in self.client.search_runs([self.experiment], max_results=50000):
      name = run.data.tags.get("fedjax_rep.run")
      if name is not None:
        self.runs[name] = run.info.run_id
        self.logged[name] = {(key, m.step) for key in run.data.metrics
                             for m in self.client.get_metric_history(run.info.run_id, key)}

  def _run(self, name: str, settings: dict) -> str:
    if name not in self.runs:
      from mlflow.entities import Param
      run = self.client.create_run(self.experiment, run_name=name,
                                   tags={"fedjax_rep.run": name})
      self.runs[name] = run.info.run_id
      self.client.log_batch(run.info.run_id, params=[Param(k, str(v))
                                                     for k, v in settings.items()])
    return self.runs[name]

  def log(self, name: str, settings: dict, values: list[tuple]) -> None:
    """Queues `values` [(tag, step, value)] for run `name` (made with params `settings`)
    until the next `flush`."""
    self.pending.setdefault(self._run(name, settings), []).extend(values)

  def flush(self) -> None:
    from mlflow.entities import Metric
    stamp = int(time.time() * 1000)
    for run_id, values in self.pending.items():
      metrics = [Metric(tag, value, stamp, step) for tag, step, value in values]
      for start in range(0, len(metrics), 1000):  # MLflow's batch limit
        self.client.log_batch(run_id, metrics=metrics[start:start + 1000])
    self.pending = {}

  def finish(self, settings: dict[str, dict], metrics: list[str]) -> None:
    """Marks every run of `settings` finished (their params were logged as they began)."""
    del metrics
    self.flush()
    for name in settings:
      if name in self.runs:
        self.client.set_terminated(self.runs[name])

  def close(self) -> None:
    self.flush()


class Tracker:
  """The sinks `sinks` (`check`) of a run of recipe `recipe` into directory `path`; with
  `fresh`, their earlier logs there are deleted first (a run started over).

  A tracked run is named by its columns (a metrics.csv row's, or those `live` is given):
  'ALGORITHM[/SETTINGS][/GRID]/seedSEED'. GRID is its combination of the swept keys `grid`
  (lr=0.03), from the columns or, for those not traced, from `combination` (set by the
  runner for each call of the recipe's run); SETTINGS its other columns (e.g.
  num_clients=100,classes_per_client=2; `setting_keys`).

  The sinks are opened, written and closed by a thread of the tracker's own, in the order
  the calls came, so that the rounds go on while it imports and writes; `finish` and
  `close` wait for it, and raise what it raised.
  """

  def __init__(self, path: str, sinks: tuple[str, ...], *, recipe: str, grid=(),
               fresh: bool = False):
    self.grid, self.combination, self.settings = tuple(grid), {}, {}
    self.sinks, self._failed, self._work = [], None, queue.Queue()
    self._thread = threading.Thread(target=self._serve, name="fedjax-rep tracker",
                                    daemon=True)
    self._thread.start()
    self._submit(self._open, path, sinks, recipe, fresh)

  def _open(self, path, sinks, recipe, fresh) -> None:
    if fresh:
      shutil.rmtree(os.path.join(path, "tensorboard"), ignore_errors=True)
      with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(path, "mlflow.db"))
    self.sinks = [TensorBoard(path) if name == "tensorboard" else MLflow(path, recipe)
                  for name in sinks]

  def _serve(self) -> None:
    """The tracker's thread: runs the submitted calls in order (none after one failed)
    until it gets None, and flushes the sinks at most SECONDS after they were written."""
    flushed = time.monotonic()
    while True:
      try:
        task = self._work.get(timeout=SECONDS)
      except queue.Empty:  # nothing came for a while: what was written reaches the files
        self._do(self._flush)
        flushed = time.monotonic()
        continue
      if task is not None:
        self._do(task)
        if time.monotonic() - flushed >= SECONDS:
          self._do(self._flush)
          flushed = time.monotonic()
      self._work.task_done()
      if task is None:
        return

  def _do(self, task) -> None:
    """task(), unless an earlier call failed; what it raises, `_wait` raises."""
    if self._failed is None:
      try:
        task()
      except BaseException as error:
        self._failed = error

  def _flush(self) -> None:
    for sink in self.sinks:
      sink.flush()

  def _submit(self, function, *args) -> None:
    self._work.put(functools.partial(function, *args))

  def _wait(self) -> None:
    """Waits until the tracker's thread has done every call submitted; raises what one of
    them raised."""
    self._work.join()
    if self._failed is not None:
      error, self._failed = self._failed, None
      raise error

  def run(self, columns: dict, keys, combination=None) -> tuple[str, dict]:
    """(name, settings) of the tracked run of `columns` (see the class) whose setting is
    its `keys`, with the swept keys `combination` (default the tracker's) where the
    columns lack them."""
    columns = {**(self.combination if combination is None else combination), **columns}
    setting = {key: columns[key] for key in keys if key not in self.grid}
    swept = {key: columns[key] for key in self.grid if key in columns}
    parts = [str(columns["algorithm"]), cfg.combination_label(setting, ","),
             cfg.combination_label(swept, ","), f"seed{columns['seed']}"]
    name = "/".join(part for part in parts if part)
    return name, {"algorithm": columns["algorithm"], "seed": columns["seed"], **setting,
                  **swept}

  def _log(self, name: str, settings: dict, step: int, values: dict) -> None:
    """Logs `values` {tag: value} at round `step` into run `name` (of `settings`), in each
    sink that does not hold them yet; values that are not numbers are left out."""
    numbers = {tag: number for tag, value in values.items()
               if (number := _number(value)) is not None}
    self.settings.setdefault(name, settings)
    for sink in self.sinks:
      logged = sink.logged.setdefault(name, set())
      new = [(tag, step, number) for tag, number in numbers.items()
             if (tag, step) not in logged]
      if new:
        logged.update((tag, step) for tag, step, _ in new)
        sink.log(name, settings, new)

  def live(self, members: list[dict]):
    """A `loop.run` callback logging each chunk's metrics and evaluation of the runs of a
    sweep axis whose columns are `members` (one dict per run: algorithm, seed, settings,
    traced combination)."""
    runs = [self.run(columns, [k for k in columns if k not in ("algorithm", "seed")])
            for columns in members]
    return lambda chunk: self._submit(self._chunk, runs, chunk)

  def _chunk(self, runs: list[tuple], chunk) -> None:
    metrics = {tag: np.reshape(v, (len(runs), -1)).tolist() for tag, v in chunk.metrics.items()}
    evaluation = {tag: np.reshape(v, (len(runs),)).tolist()
                  for tag, v in chunk.eval_metrics.items()}
    steps = chunk.rounds.tolist()
    for i, (name, settings) in enumerate(runs):
      for j, step in enumerate(steps):
        values = {tag: v[i][j] for tag, v in metrics.items()}
        if j == len(steps) - 1:
          values.update({tag: v[i] for tag, v in evaluation.items()})
        self._log(name, settings, step, values)

  def rows(self, rows: list[dict]) -> None:
    """Logs every metric of metrics.csv's `rows` at its round (those not logged already):
    the columns that are not algorithm, seed, round, grid, a swept key or a setting
    (`setting_keys`)."""
    self._submit(self._rows, rows, dict(self.combination))

  def _rows(self, rows: list[dict], combination: dict) -> None:
    for row in rows:
      keys = setting_keys(row)
      names = {"algorithm", "seed", "round", "grid", *self.grid, *keys}
      self._log(*self.run(row, keys, combination), int(row.get("round", 0)),
                {k: v for k, v in row.items() if k not in names})

  def finish(self, entries: list[dict]) -> None:
    """Adds the summary table `entries` (rows with algorithm, maybe settings and swept keys)
    to the runs they describe, as metrics SUMMARY + NAME at each run's last round, then the
    settings (HParams, run params) and the runs' end; returns once all is written."""
    self._submit(self._finish, entries)
    self._wait()

  def _finish(self, entries: list[dict]) -> None:
    last = {}
    for sink in self.sinks:
      for name, logged in sink.logged.items():
        last[name] = max([last.get(name, 0)] + [step for _, step in logged])
    tags = set()
    for name, settings in self.settings.items():
      for entry in entries:
        if all(entry[key] == value for key, value in settings.items() if key in entry):
          values = {SUMMARY + k: v for k, v in entry.items()
                    if k not in settings and _number(v) is not None and
                    math.isfinite(_number(v))}
          tags.update(values)
          self._log(name, settings, last.get(name, 0), values)
    for sink in self.sinks:
      sink.finish(self.settings, sorted(tags))
      sink.flush()

  def close(self) -> None:
    """Writes what is left, closes the sinks and ends the tracker's thread."""
    if not self._thread.is_alive():
      return
    self._submit(lambda: [sink.close() for sink in self.sinks])
    self._work.put(None)
    self._thread.join()
    if self._failed is not None:
      error, self._failed = self._failed, None
      raise error

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def setting_keys(row: dict) -> list[str]:
  """The columns of a metrics.csv row that say which run it is of, besides algorithm and
  seed: those between `round` and `diverged_round` in a row of a run's rounds (as
  `shared.round_rows` gives them, and `runner.diverged_lines` names runs), else (a row of
  what a recipe computes besides, e.g. a fine-tuning error per number of samples) its
  columns after `round` that are not floats."""
  keys = list(row)
  after = keys[keys.index("round") + 1:] if "round" in row else keys
  if "diverged_round" in after:
    return after[:after.index("diverged_round")]
  return [k for k in after if k != "grid" and not isinstance(row[k], (float, np.floating))]


def check_new(path: str) -> None:
  """ConfigError when directory `path` already holds a tracker's logs (DIR/tensorboard or
  DIR/mlflow.db), which a new run's would mix with."""
  held = [name for name in ("tensorboard", "mlflow.db")
          if os.path.exists(os.path.join(path, name))]
  if held:
    raise cfg.ConfigError(f"log_dir {path} already holds {' and '.join(held)} of another run: "
                          f"give a new log_dir")
