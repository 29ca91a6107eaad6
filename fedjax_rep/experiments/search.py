"""Searches that stop bad settings early (`fedjax-rep run ... --search halving|hyperband`):
successive halving (Jamieson & Talwalkar 2016) and Hyperband (Li et al. 2017) over a grid's
candidates, each rung one program.

A search runs inside the batch runner (`batch.Batch.train` of a grid's candidates: one
algorithm on one setting's runs, e.g. Table 1's (n, S)): rung k runs its surviving
settings, every seed of each, from where the rung before stopped to its own last round, as
one program (calls of as many as fit in memory, on every backend), each survivor continued
from its own state (gathered by index; no restart). After a rung the settings are ranked by
their validation accuracy at its last round, averaged over seeds (a diverged run ranks
last), and the best 1/eta continue; test numbers never enter a decision. Rungs end at
evaluations (multiples of eval_every), the last at the recipe's rounds, so a survivor has
the rounds and evaluations of its setting run alone. The schedules: `halving`,
`Search.brackets`.
"""

import dataclasses
import math

import jax
import numpy as np

from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import plotting

METHODS = ("halving", "hyperband")
METRIC = "val_accuracy"  # the evaluation metric that ranks the settings of a rung
DEFAULT_ETA = 3
SEED_TAG = 0x68626E64  # Hyperband's choice of a bracket's candidates: rng((seed, tag, s))
# The columns of search.csv that describe a rung, not the setting.
RUNG_COLUMNS = ("bracket", "rung", "rounds", "settings", "val_accuracy",
                "val_accuracy_std_over_seeds", "rank", "outcome")


def halving(count: int, rounds: int, eval_every: int, eta: int, min_rounds: int,
            depth: int | None = None) -> list[tuple[int, int]]:
  """Successive halving's rungs for `count` settings: [(settings, last round), ...]. With
  E = rounds // eval_every evaluations there are K + 1 rungs, K = `depth` (default: the
  largest with eta^K <= count and E // eta^K >= ceil(min_rounds / eval_every)); rung k
  keeps count // eta^k settings (at least 1) and ends at eval_every * (E // eta^(K - k))
  rounds, the last at `rounds`."""
  budget, least = rounds // eval_every, max(1, math.ceil(min_rounds / eval_every))
  if depth is None:
    depth = 0
    while eta ** (depth + 1) <= count and budget // eta ** (depth + 1) >= least:
      depth += 1
  ends = [eval_every * (budget // eta ** (depth - k)) for k in range(depth)] + [rounds]
  return [(max(1, count // eta ** k), end) for k, end in enumerate(ends)]


def hyperband_depth(rounds: int, eval_every: int, eta: int, min_rounds: int) -> int:
  """s_max: the deepest bracket whose first rung has at least `min_rounds` rounds."""
  budget, least = rounds // eval_every, max(1, math.ceil(min_rounds / eval_every))
  depth = 0
  while budget // eta ** (depth + 1) >= least:
    depth += 1
  return depth


@dataclasses.dataclass
class Search:
  """A search and what it found.

  method: one of METHODS; eta: the fraction 1/eta of a rung's settings that continue;
  min_rounds: the rounds of the shortest rung (None: eval_every); seed: Hyperband's choice
  of each bracket's candidates. records: search.csv's rows, one per (bracket, rung,
  setting) run so far, each with the members' columns (algorithm, setting, swept keys),
  `columns` and RUNG_COLUMNS; columns: what the runner adds to the records of the calls
  it runs now (a grid's shape-changing keys).
  """
  method: str
  eta: int = DEFAULT_ETA
  min_rounds: int | None = None
  seed: int = 0
  records: list = dataclasses.field(default_factory=list)
  columns: dict = dataclasses.field(default_factory=dict)

  def brackets(self, count: int, rounds: int, eval_every: int) -> list[tuple[list, list]]:
    """[(candidates: indices of the `count` settings, rungs: `halving`'s), ...] of this
    search, in the order they run: halving, one bracket of all; Hyperband, the brackets
    s = s_max, ..., 0 (`hyperband_depth`), bracket s a halving of depth s over
    ceil((s_max + 1) / (s + 1) * eta^s) candidates (all where that is more, else that many
    chosen by the seed): some start many settings at few rounds, others few at many."""
    least = self.min_rounds or eval_every
    if self.method == "halving":
      return [(list(range(count)), halving(count, rounds, eval_every, self.eta, least))]
    top = hyperband_depth(rounds, eval_every, self.eta, least)
    out = []
    for s in range(top, -1, -1):
      size = math.ceil((top + 1) / (s + 1) * self.eta ** s)
      chosen = (list(range(count)) if size >= count else sorted(
          np.random.default_rng((self.seed, SEED_TAG, s)).permutation(count)[:size].tolist()))
      out.append((chosen, halving(len(chosen), rounds, eval_every, self.eta, least, s)))
    return out

  def record(self) -> dict:
    """What config.json records of the search (method, eta, min_rounds)."""
    return {"method": self.method, "eta": self.eta, "min_rounds": self.min_rounds}

  def train(self, batch, name, algorithm, data, settings, keys, rounds, *, members,
            eval_every, blowup, desc) -> list[dict]:
    """`batch.Batch.train`'s result for a grid's candidates `settings` under this search:
    per setting, "metrics" {name: [R, rounds]}, "eval_rounds" [E] (those of a run alone)
    and "eval" {name: [R, E]}, NaN from the round after it was stopped. The runs of `data`
    that share their members' columns but the seed (e.g. Table 1's (n, S)) are searched
    apart: each group chooses its own survivors. Rung k of bracket b runs as the unit
    NAME[-gI][-bB]-rungK (`Batch.calls`); each adds its records."""
    if eval_every is None:
      raise ValueError("a search ranks on evaluations: give eval_every")
    schedule = np.array(sorted({*range(eval_every, rounds + 1, eval_every), rounds}))
    groups = {}
    for r, member in enumerate(members[0]):
      groups.setdefault(tuple((k, v) for k, v in member.items() if k != "seed"), []).append(r)
    runs = len(members[0])
    filled = [{"metrics": {}, "eval": {}, "eval_rounds": schedule} for _ in settings]
    brackets = self.brackets(len(settings), rounds, eval_every)
    for i, index in enumerate(groups.values()):
      part = (lambda tree: tree) if len(groups) == 1 else (
          lambda tree: jax.tree.map(lambda a: a[np.array(index)], tree))
      group_name = name if len(groups) == 1 else f"{name}-g{i}"
      furthest = {}
      for b, (candidates, rungs) in enumerate(brackets):
        prefix = group_name if len(brackets) == 1 else f"{group_name}-b{b}"
        chains = self._bracket(batch, prefix, algorithm, part(data), settings, part(keys),
                               candidates, rungs, [[m[r] for r in index] for m in members],
                               eval_every, blowup, desc or name,
                               b if len(brackets) > 1 else None)
        for g, chain in chains.items():
          if len(chain) and _last_round(chain) > _last_round(furthest.get(g, [])):
            furthest[g] = chain
      for g, chain in furthest.items():
        _place(filled[g], chain, index, runs, rounds, schedule)
    ran = next(r for r in filled if r["metrics"])
    for result in filled:  # a candidate no bracket ran (Hyperband): NaN throughout
      for part in ("metrics", "eval"):
        for key, value in ran[part].items():
          result[part].setdefault(key, np.full(value.shape, np.nan))
      _whole(result)
    return filled

  def _bracket(self, batch, prefix, algorithm, data, settings, keys, candidates, rungs,
               members, eval_every, blowup, desc, bracket) -> dict:
    """{setting: [its result of each rung it ran]} of one bracket of successive halving
    over `candidates` with `rungs`, a rung's settings in one call where they fit (the
    batch's width, if it has one); adds the bracket's records."""
    alive, carried, start = list(candidates), None, 0
    chains = {g: [] for g in alive}
    for k, (_, end) in enumerate(rungs):
      last = k == len(rungs) - 1
      wide = dataclasses.replace(batch, width=batch.width or len(alive))
      outs = wide.calls(f"{prefix}-rung{k}", algorithm, data, [settings[g] for g in alive],
                         keys, end, members=[members[g] for g in alive],
                         eval_every=eval_every, blowup=blowup, desc=f"{desc} rung {k}",
                         carried=carried, start_round=start, carry=not last)
      scores = []
      for out in outs:
        if METRIC not in out.get("eval", {}):
          raise RuntimeError(f"a search ranks on {METRIC}, which the evaluations lack")
        at_end = np.asarray(out["eval"][METRIC], float)[:, -1]
        scores.append((float(np.mean(at_end)), float(np.std(at_end))))
      means = np.array([m for m, _ in scores])
      order = np.argsort(np.where(np.isnan(means), np.inf, -means), kind="stable")
      kept = set() if last else set(order[:rungs[k + 1][0]].tolist())
      rank = {int(p): n + 1 for n, p in enumerate(order)}
      for p, (g, out) in enumerate(zip(alive, outs)):
        chains[g].append(out)
        columns = {key: v for key, v in members[g][0].items() if key != "seed"}
        self.records.append({
            **columns, **self.columns, **({} if bracket is None else {"bracket": bracket}),
            "rung": k, "rounds": end, "settings": len(alive), METRIC: scores[p][0],
            f"{METRIC}_std_over_seeds": scores[p][1], "rank": rank[p],
            "outcome": "final" if last else "continued" if p in kept else "stopped"})
      if last:
        break
      carried = [outs[p]["carry"] for p in sorted(kept)]
      alive, start = [alive[p] for p in sorted(kept)], end
    return chains


def _last_round(chain: list[dict]) -> int:
  """The last round a setting's rung results `chain` reached (0 for none)."""
  return sum(next(iter(out["metrics"].values())).shape[1] for out in chain)


def _place(result: dict, chain: list[dict], index: list[int], runs: int, rounds: int,
           schedule) -> None:
  """Writes a setting's rung results `chain` on its runs `index` (of `runs`) into `result`,
  metrics [runs, rounds] and eval [runs, E] at the evaluated rounds `schedule` [E], NaN
  where they did not run; keeps each metric's dtype in "dtypes"."""
  dtypes = result.setdefault("dtypes", {})
  for part, at in (("metrics", None), ("eval", schedule)):
    for key in chain[0][part]:
      joined = np.concatenate([np.asarray(out[part][key]) for out in chain], axis=1)
      dtypes[key] = joined.dtype
      shape = (runs, rounds if at is None else len(at))
      whole = result[part].setdefault(key, np.full(shape, np.nan))
      if at is None:
        whole[np.array(index), :joined.shape[1]] = joined
      else:
        done = np.concatenate([np.asarray(out["eval_rounds"]) for out in chain])
        columns = np.searchsorted(at, done)
        whole[np.ix_(np.array(index), columns)] = joined


def _whole(result: dict) -> None:
  """`result` (`_place`d) with each metric back in its own dtype where nothing is NaN;
  the dtypes dropped."""
  dtypes = result.pop("dtypes", {})
  for part in ("metrics", "eval"):
    for key, value in result[part].items():
      if key in dtypes and not np.isnan(value).any():
        result[part][key] = value.astype(dtypes[key])


def check(method, eta, min_rounds, configs, count: int, searchable: bool) -> None:
  """ConfigError (one line) unless `method` is one of METHODS, `eta` an integer >= 2,
  `min_rounds` None or an integer >= 1, the recipe `searchable` and each configuration of
  `configs` (a sweep's) holds out validation data and has a schedule of two rungs or more
  (halving over `count` candidates; Hyperband's deepest bracket)."""
  if method not in METHODS:
    raise cfg.ConfigError(f"--search must be one of {', '.join(METHODS)}, got {method!r}")
  if isinstance(eta, bool) or not isinstance(eta, int) or eta < 2:
    raise cfg.ConfigError(f"--eta must be an integer >= 2 (the 1/eta of a rung's settings "
                          f"that continue), got {eta!r}")
  if min_rounds is not None and (isinstance(min_rounds, bool) or not isinstance(
      min_rounds, int) or min_rounds < 1):
    raise cfg.ConfigError(f"--min-rounds must be an integer >= 1, got {min_rounds!r}")
  if not searchable:
    raise cfg.ConfigError("--search runs on the recipes whose grids train as one program per "
                          "algorithm and setting: digits-personalized, fedrep-table1-*, "
                          "table1-synthetic, flute-table1")
  for each in configs:
    if not each.validation_fraction > 0:
      raise cfg.ConfigError("--search ranks settings on validation data, and "
                            "validation_fraction is 0 (no validation split): give --set "
                            "validation_fraction=0.2 (or another value in (0, 1))")
    least = min_rounds or each.eval_every
    rungs = len(halving(count, each.rounds, each.eval_every, eta, least)
                if method == "halving" else
                halving(1, each.rounds, each.eval_every, eta, least,
                        hyperband_depth(each.rounds, each.eval_every, eta, least)))
    if rungs < 2:
      raise cfg.ConfigError(
          f"--search {method} stops settings at evaluations, and rounds={each.rounds}, "
          f"eval_every={each.eval_every}, min_rounds={least}, eta={eta} over {count} "
          f"candidates leave one rung (no setting is stopped): give more rounds, a smaller "
          f"eval_every or --min-rounds, or more candidates")


def selection_columns(rows: list[dict], records: list[dict], keys: list[str]) -> list[dict]:
  """selection.csv's `rows` (`selection.choose`, by setting `keys` and `grid` label) with the
  furthest rung each choice reached in the search's `records` (with `grid` labels): rung,
  rung_rounds and its validation accuracy there, rung_val_accuracy."""
  out = []
  for row in rows:
    mine = [r for r in records if r.get("grid") == row["grid"]
            and all(r.get(k) == row[k] for k in keys)]
    top = max(mine, key=lambda r: (r["rounds"], -r.get("bracket", 0)), default={})
    out.append({**row, "rung": top.get("rung", ""), "rung_rounds": top.get("rounds", ""),
                "rung_val_accuracy": top.get(METRIC, np.nan)})
  return out


def plot(rows: list[dict], records: list[dict], chosen: list[dict], keys: list[str],
         file) -> None:
  """One panel per setting (`keys`: algorithm, ...), titled with its choice: each candidate's
  validation accuracy (mean over seeds) against round from metrics.csv `rows`, the chosen
  one thick, the others that reached the last rung thin, those stopped grey up to the
  round where they stopped (a cross there); dotted lines at the rungs' ends (`records`)."""
  fig, axes = plotting.grid_of(len(chosen), min(len(chosen), 3), width=4.6, height=3.6)
  for ax, choice in zip(axes, chosen):
    same = lambda r: all(r.get(k) == choice[k] for k in keys)
    mine = [r for r in records if same(r)]
    reached = {}
    for r in mine:
      reached[r["grid"]] = max(reached.get(r["grid"], 0), r["rounds"])
    final = max(reached.values(), default=0)
    for end in sorted({r["rounds"] for r in mine}):
      ax.axvline(end, color="0.75", ls=":", lw=0.9)
    curves = {}
    for r in rows:
      if same(r) and isinstance(r.get(METRIC), float) and np.isfinite(r[METRIC]):
        curves.setdefault(r["grid"], {}).setdefault(r["round"], []).append(r[METRIC])
    for label in sorted(curves, key=lambda lbl: (lbl == choice["grid"], reached.get(lbl, 0))):
      rounds = sorted(curves[label])
      means = [np.mean(curves[label][t]) for t in rounds]
      if label == choice["grid"]:
        ax.plot(rounds, means, lw=2.4, color="C3", label="chosen (in the title)", zorder=3)
      elif reached.get(label, 0) >= final:
        ax.plot(rounds, means, lw=1.0, color="C0", alpha=0.8, label="reached the last rung")
      else:
        ax.plot(rounds, means, lw=0.8, color="0.6", label="stopped at a rung (x)")
        ax.plot(rounds[-1], means[-1], "x", color="0.45", ms=4)
    setting = ", ".join(str(choice[k]) if k == "algorithm" else f"{k}={choice[k]}"
                        for k in sorted(keys, key=lambda k: k != "algorithm"))
    ax.set(xlabel="round", ylabel="validation accuracy (mean over seeds)",
           title=f"{setting}\nchosen: {choice['grid']}")
    ax.grid(alpha=0.3)
  fig.suptitle(f"search: each candidate's validation accuracy, {len(set(reached)) if chosen else 0}"
               f" candidates per panel; dotted: the rungs' ends")
  plotting.save(fig, file)
