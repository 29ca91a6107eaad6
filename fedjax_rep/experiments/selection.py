"""Choosing a grid's combination on validation data (`fedjax-rep run ... --select`).

Per algorithm (and per setting of a recipe with several, e.g. Table 1's (n, S)), the
combination of the swept keys whose validation statistic, averaged over seeds, is the
largest; test numbers never enter the choice. selection.csv holds the chosen values, the
validation mean and std over seeds, and the test statistic of that choice, optionally
again on fresh seeds (`confirm`), as pFL-Bench reruns its best configuration.
"""

import numpy as np

from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import plotting

# The columns of a summary entry (`neural.summary`) or of selection.csv that are results,
# not a setting.
RESULTS = ("combinations", "at_edge", "confirm_test_accuracy",
           "confirm_test_accuracy_std_over_seeds", "confirm_seeds", "test_accuracy",
           "test_accuracy_std_over_seeds", "val_accuracy", "val_accuracy_std_over_seeds",
           "statistic", "seeds", "diverged", "last_evaluations", "rounds_to_95",
           "upload_bytes", "download_bytes", "flops_per_round", "paper_test_accuracy",
           "new_accuracy", "new_accuracy_std_over_seeds", "participation_gap", "rung",
           "rung_rounds", "rung_val_accuracy", "dp_epsilon")


def check(config, swept: cfg.Sweep, confirm_seeds: int | None) -> None:
  """ConfigError (one line) unless there is a grid to choose from (the sweep `swept` of
  `config`), every combination of it has a validation split to select on
  (`validation_fraction` > 0) and `confirm_seeds` is None or an integer >= 1."""
  if config.validation_fraction is None:
    raise cfg.ConfigError("--select chooses on validation data, which only the neural recipes "
                          "hold out (validation_fraction); this recipe has none")
  if not swept.values:
    raise cfg.ConfigError("--select chooses among the combinations of a grid: give the "
                          "values to choose from, e.g. --grid lr=0.01,0.03,0.1")
  for each in swept.configs:
    if not each.validation_fraction > 0:
      raise cfg.ConfigError("--select chooses on validation data, and validation_fraction is "
                            "0 (no validation split): give --set validation_fraction=0.2 (or "
                            "another value in (0, 1))")
  if confirm_seeds is not None and (isinstance(confirm_seeds, bool)
                                    or not isinstance(confirm_seeds, int) or confirm_seeds < 1):
    raise cfg.ConfigError(f"--confirm-seeds must be an integer >= 1, got {confirm_seeds!r}")


def setting_keys(entries: list[dict], grid: dict) -> list[str]:
  """The columns of summary `entries` that name a setting (the algorithm and, e.g., n and S):
  neither a result (RESULTS) nor a swept key nor the `grid` label."""
  keys = dict.fromkeys(k for e in entries for k in e)
  return [k for k in keys if k not in RESULTS and k not in grid and k != "grid"]


def choose(entries: list[dict], grid: dict) -> list[dict]:
  """selection.csv's rows from the summary `entries` of every combination of `grid` (each
  with its swept keys, its `grid` label and val_accuracy): per setting (`setting_keys`),
  the entry of the largest val_accuracy (the first of equals; NaN never wins), with its
  setting, its swept values, `grid`, val_accuracy and its std over seeds, test_accuracy
  and its std, the statistic, the seeds and how many combinations were compared. Raises
  ConfigError (one line) where no combination of a setting has a validation score."""
  keys = setting_keys(entries, grid)
  groups = {}
  for entry in entries:
    groups.setdefault(tuple(entry[k] for k in keys), []).append(entry)
  rows = []
  for setting, group in groups.items():
    scores = np.array([e.get("val_accuracy", np.nan) for e in group], float)
    if not np.isfinite(scores).any():
      named = ", ".join(f"{k}={v}" for k, v in zip(keys, setting))
      raise cfg.ConfigError(f"--select: no combination of {named} has a validation score "
                            f"(val_accuracy) to choose by: its runs held no validation split "
                            f"or all diverged; give validation_fraction > 0 (e.g. --set "
                            f"validation_fraction=0.2) and values that do not diverge")
    best = group[int(np.nanargmax(scores))]
    rows.append({**dict(zip(keys, setting)), **{k: best[k] for k in grid},
                 "grid": best["grid"], "val_accuracy": best.get("val_accuracy", np.nan),
                 "val_accuracy_std_over_seeds": best.get("val_accuracy_std_over_seeds", np.nan),
                 "test_accuracy": best["test_accuracy"],
                 "test_accuracy_std_over_seeds": best["test_accuracy_std_over_seeds"],
                 "statistic": best["statistic"], "seeds": best["seeds"],
                 "combinations": len(group),
                 "at_edge": "; ".join(edges({k: best[k] for k in grid}, grid))})
  return rows


def chosen_rows(rows: list[dict], chosen: list[dict], keys: list[str]) -> list[dict]:
  """The metrics.csv `rows` of the `chosen` combinations (`choose`'s rows): those whose
  setting `keys` (algorithm, ...) and `grid` label are a choice's."""
  wanted = {(*(row[k] for k in keys), row["grid"]) for row in chosen}
  return [r for r in rows if (*(r.get(k) for k in keys), r.get("grid")) in wanted]


def edges(chosen: dict, grid: dict) -> list[str]:
  """The swept keys whose `chosen` value is the smallest or the largest of the grid's values
  (numbers, at least 3 of them: with 2, every choice is at an edge), e.g. ["lr=0.1, the
  largest of 0.01..0.1"]: a search that should go further there."""
  out = []
  for key, values in grid.items():
    numbers = sorted({v for v in values if isinstance(v, (int, float))
                      and not isinstance(v, bool)})
    if len(numbers) < 3 or chosen[key] not in (numbers[0], numbers[-1]):
      continue
    side = "smallest" if chosen[key] == numbers[0] else "largest"
    out.append(f"{key}={chosen[key]:g}, the {side} of {numbers[0]:g}..{numbers[-1]:g}")
  return out


def edge_lines(rows: list[dict], grid: dict) -> list[str]:
  """One line per choice of `rows` (`choose`) at an edge of the grid: what was chosen where,
  and that the next grid should reach past it."""
  keys = setting_keys(rows, grid)
  return [f"fedjax-rep: --select chose {row['at_edge']} for "
          f"{', '.join(f'{k}={row[k]}' for k in keys)}: the best may lie outside the grid; "
          f"widen it there" for row in rows if row["at_edge"]]


def confirmed(rows: list[dict], entries: list[dict], grid: dict, seeds: int) -> list[dict]:
  """`rows` (`choose`) with the test statistic of each choice on fresh seeds: `entries` are
  the summary entries of runs of the chosen combinations on `seeds` new seeds (with their
  swept keys); adds confirm_test_accuracy, its std over seeds and confirm_seeds."""
  keys = setting_keys(rows, grid)
  out = []
  for row in rows:
    match = [e for e in entries if all(e.get(k) == row[k] for k in (*keys, *grid))]
    entry = match[0] if match else {}
    out.append({**row, "confirm_test_accuracy": entry.get("test_accuracy", np.nan),
                "confirm_test_accuracy_std_over_seeds":
                    entry.get("test_accuracy_std_over_seeds", np.nan),
                "confirm_seeds": seeds})
  return out


def plot(entries: list[dict], rows: list[dict], grid: dict, file) -> None:
  """One panel per swept key: per algorithm (and setting), the best validation statistic
  over the combinations with each value of the key (its std over seeds as an error bar),
  the chosen value ringed."""
  keys = setting_keys(entries, grid)
  fig, axes = plotting.grid_of(len(grid), min(len(grid), 3), width=4.2, height=3.2)
  for ax, key in zip(axes, grid):
    values = list(grid[key])
    positions = np.arange(len(values))
    for row in rows:
      same = [e for e in entries if all(e[k] == row[k] for k in keys)]
      best = [max((e for e in same if e[key] == v), default=None,
                  key=lambda e: np.nan_to_num(e.get("val_accuracy", np.nan), nan=-1.0))
              for v in values]
      mean = [np.nan if b is None else b.get("val_accuracy", np.nan) for b in best]
      spread = [np.nan if b is None else b.get("val_accuracy_std_over_seeds", np.nan)
                for b in best]
      label = ", ".join(str(row[k]) for k in keys)
      line = ax.errorbar(positions, mean, yerr=spread, marker="o", ms=4, capsize=2,
                         label=label)
      chosen = values.index(row[key])
      ax.plot(positions[chosen], mean[chosen], "o", ms=11, mfc="none",
              color=line[0].get_color())
    ax.set_xticks(positions, [f"{v:g}" if isinstance(v, float) else str(v) for v in values])
    ax.set(xlabel=key, ylabel="validation accuracy")
    ax.grid(alpha=0.3)
  fig.suptitle(f"validation accuracy ({rows[0]['statistic']}, mean over seeds) against "
               f"each swept key,\nthe best over the other keys; ringed: the combination "
               f"chosen")
  plotting.save(fig, file)
