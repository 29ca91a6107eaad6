"""The neural recipes' metrics.csv rows and summaries: each run's statistic of its
evaluations (the papers' mean of the last 10), its mean and spread over seeds, rounds to
95%, and the words that say which statistic a table or figure reports."""

import numpy as np

from fedjax_rep.recipes.kit import shared

LAST_EVALUATIONS = 10  # the papers' accuracy: the mean over the last 10 evaluations
# The statistic of a run's test accuracies that summaries report (then averaged over seeds).
STATISTICS = ("last10", "last", "best")
ROUNDS_TO_FRACTION = 0.95  # rounds_to_95: the first round reaching this fraction of the statistic
# The columns of what a method costs per round (`nn.cost`), on its rows for the summary
# (`Recipe.summary_only`: not in metrics.csv).
COST = ("upload_bytes", "download_bytes", "flops_per_round")


def rows(name, seed_values, result, **columns):
  """metrics.csv rows of one algorithm: every round has train_loss; the evaluated rounds
  also the evaluation's metrics (`nn.algorithm.accuracy_metrics`: test_accuracy,
  test_accuracy_weighted, test_accuracy_std, test_accuracy_p10, test_clients, an integer;
  the val_ ones with a validation split); every round the result's `cost` (COST), where
  it has one."""
  out = shared.round_rows(name, seed_values, result["metrics"], **columns)
  rounds = result["metrics"]["train_loss"].shape[1]
  for e, t in enumerate(np.asarray(result["eval_rounds"])):
    for s in range(len(seed_values)):
      row = out[s * rounds + int(t) - 1]
      row.update({k: np.asarray(v)[s, e].item() for k, v in result["eval"].items()})
  for row in out:
    row.update(result.get("cost", {}))
  return out


def run_statistic(accuracies: list[float], statistic: str) -> float:
  """`statistic` (one of STATISTICS) of a run's test accuracies in round order: the mean of
  the last LAST_EVALUATIONS (all where fewer), the last, or the largest."""
  if statistic == "best":
    return float(np.max(accuracies))
  return float(np.mean(accuracies[-(1 if statistic == "last" else LAST_EVALUATIONS):]))


def seed_statistics(evaluations: list[tuple], statistic: str) -> dict:
  """A run's statistics from its evaluations [(round, test accuracy, validation accuracy or
  None, new clients' accuracy or None), ...] in round order: `test` and, with a validation
  split, `val`, with new clients `new`: `run_statistic` of each, except that `best` with a
  validation split takes the evaluation of the best validation accuracy (the first of
  equals) and reports the test (and new) accuracy there; and `rounds_to_95`, the first
  evaluated round whose accuracy (validation where split) reaches 95% of that statistic
  (NaN where none does)."""
  rounds = [t for t, _, _, _ in evaluations]
  column = lambda i: np.array([np.nan if e[i] is None else e[i] for e in evaluations], float)
  tests, vals, news = column(1), column(2), column(3)
  split, held = bool(np.isfinite(vals).any()), bool(np.isfinite(news).any())
  if statistic == "best" and split:
    best = int(np.nanargmax(vals))
    out = {"test": float(tests[best]), "val": float(vals[best])}
    if held:
      out["new"] = float(news[best])
  else:
    out = {"test": run_statistic(list(tests), statistic)}
    if split:
      out["val"] = run_statistic(list(vals), statistic)
    if held:
      out["new"] = run_statistic(list(news), statistic)
  curve, final = (vals, out["val"]) if split else (tests, out["test"])
  reached = np.flatnonzero(curve >= ROUNDS_TO_FRACTION * final)
  out["rounds_to_95"] = float(rounds[reached[0]]) if reached.size else float("nan")
  return out


def summary(metrics_rows, algorithms_order, statistic: str = "last10"):
  """Per algorithm: the mean over the seeds whose run did not diverge (and its std) of each
  seed's statistic of its test accuracies (`seed_statistics`; default: the mean of its
  last 10 evaluations, as the papers report; NaN where every run diverged); with a
  validation split (val_accuracy in the rows) the same of its validation accuracies
  (val_accuracy, val_accuracy_std_over_seeds), and `best` then picks each run's round by
  validation; with new clients (new_accuracy in the rows) the same of theirs (new_accuracy,
  new_accuracy_std_over_seeds) and participation_gap = test_accuracy - new_accuracy (the
  training clients' accuracy less the new clients'); with user-level DP (dp_epsilon in the
  rows) the ε the run spent, dp_epsilon. `statistic` says which
  (`statistic_text`), `last_evaluations` how many evaluations it was taken over (the fewest
  of any seed; 0 where none was), `seeds` how many seeds were averaged, `diverged` how
  many were left out because their run diverged (a `diverged_round` in its rows),
  `rounds_to_95` the mean over seeds of the first round reaching 95% of the statistic, and
  the cost columns of its rows (COST) where they have them."""
  table = []
  nan = float("nan")
  for name in algorithms_order:
    per_seed, diverged, cost, spent = {}, set(), {}, []
    for r in metrics_rows:
      if r["algorithm"] != name:
        continue
      cost = cost or {k: r[k] for k in COST if k in r}
      if r.get("dp_epsilon") is not None:
        spent.append(r["dp_epsilon"])
      if r.get("diverged_round"):
        diverged.add(r["seed"])
      elif r.get("test_accuracy") is not None:
        per_seed.setdefault(r["seed"], []).append(
            (r["round"], r["test_accuracy"], r.get("val_accuracy"), r.get("new_accuracy")))
    finals = [seed_statistics(sorted(v, key=lambda e: e[0]), statistic)
              for v in per_seed.values()]
    evaluations = min(map(len, per_seed.values()), default=0)
    mean = lambda key: float(np.mean([f[key] for f in finals])) if finals else nan
    std = lambda key: float(np.std([f[key] for f in finals])) if finals else nan
    split = bool(finals) and all("val" in f for f in finals)
    held = bool(finals) and all("new" in f for f in finals)
    text = statistic_text(statistic, evaluations)
    table.append({"algorithm": name,
                  "test_accuracy": mean("test"),
                  "test_accuracy_std_over_seeds": std("test"),
                  **({"val_accuracy": mean("val"), "val_accuracy_std_over_seeds": std("val")}
                     if split else {}),
                  **({"new_accuracy": mean("new"), "new_accuracy_std_over_seeds": std("new"),
                      "participation_gap": mean("test") - mean("new")} if held else {}),
                  "statistic": (f"test at the best validation of {evaluations} evaluations"
                                if split and statistic == "best" else text),
                  "seeds": len(finals), "diverged": len(diverged),
                  "last_evaluations": min({"last10": LAST_EVALUATIONS, "last": 1,
                                           "best": evaluations}[statistic], evaluations),
                  "rounds_to_95": float(np.nanmean([f["rounds_to_95"] for f in finals]))
                  if finals and not all(np.isnan(f["rounds_to_95"]) for f in finals) else nan,
                  **({"dp_epsilon": float(np.nanmax(spent))} if spent else {}),
                  **cost})
  return table


def statistic_text(statistic: str, evaluations: int) -> str:
  """Words for `statistic` of runs of `evaluations` evaluations: "mean of the last 10
  evaluations" (or "mean of all 3 evaluations" where there are 10 or fewer), "last
  evaluation", "best of 12 evaluations"; "no evaluation" where there is none (every run
  diverged)."""
  if evaluations == 0:
    return "no evaluation"
  if statistic == "last":
    return "last evaluation"
  if statistic == "best":
    return f"best of {evaluations} evaluations"
  if evaluations > LAST_EVALUATIONS:
    return f"mean of the last {LAST_EVALUATIONS} evaluations"
  return f"mean of all {evaluations} evaluations"


def averaged_text(rows, statistic: str = "last10") -> str:
  """What a summary of `rows` reports, for a figure's title (`statistic_text`), e.g. "mean
  of the last 10 evaluations"."""
  evaluations = len({r["round"] for r in rows if r.get("test_accuracy") is not None})
  return statistic_text(statistic, evaluations)
