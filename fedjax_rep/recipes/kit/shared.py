"""What every recipe shares, linear or neural: seeds, their keys, trained runs and
metrics.csv rows."""

import jax
import numpy as np



def seed_keys(first_seed: int, seeds: int) -> jax.Array:
  """Keys [seeds, 3] (problem, data, run) of seeds first_seed, first_seed + 1, ..."""
  return _seed_keys(np.arange(first_seed, first_seed + seeds, dtype=np.int32))


@jax.jit
def _seed_keys(seed_values):
  return jax.vmap(lambda s: jax.random.split(jax.random.key(s), 3))(seed_values)


@jax.jit
def run_keys(keys: jax.Array, index: jax.Array | None = None) -> jax.Array:
  """The run keys [runs] of keys [seeds, 3] (seed_keys), of the seeds `index` [runs]
  (default all, in order); jitted, so that no eager op compiles on the way."""
  return keys[:, 2] if index is None else keys[index, 2]


def members(algorithm: str, seeds: list[int], **columns) -> list[dict]:
  """The metrics.csv columns of the runs of `algorithm` on `seeds`, in order, with
  `columns` (as `round_rows` gives its rows): the runs a tracker logs (`Batch.live`)."""
  return [{"algorithm": algorithm, "seed": seed, **columns} for seed in seeds]


def trained(batch, algorithm, data, hparams, keys, num_rounds, keep=("B",), members=None):
  """Unit '<name>-train' of `batch` (`batch.Batch.train`): `algorithm` on every seed of
  `data` (a leading seed axis) with `hparams`; metrics [seeds, rounds], plus the final
  state's fields `keep` ([seeds, ...]) under their own names. keys [seeds, 3] (seed_keys);
  `members`: each run's metrics.csv columns (`members`), logged live."""
  result = batch.train(
      f"{algorithm.name}-train", algorithm, data, [hparams], run_keys(keys), num_rounds,
      members=members and [members], desc=algorithm.name,
      keep=lambda state: {k: np.asarray(getattr(state, k)) for k in keep})[0]
  return {**result["metrics"], **{k: result[k] for k in keep}}


def nan_where_diverged(values, metrics: dict[str, np.ndarray]) -> np.ndarray:
  """`values` [seeds, ...] computed from the final states of the runs of `metrics` (a
  loop's metrics [seeds, rounds], with its `diverged` flags), NaN for the runs that
  diverged: their final state is the one kept from before they diverged."""
  diverged = np.asarray(metrics["diverged"])[:, -1] > 0
  values = np.asarray(values)
  return np.where(diverged.reshape(-1, *[1] * (values.ndim - 1)), np.nan, values)


def round_rows(algorithm: str, seeds: list[int], metrics: dict[str, np.ndarray], **columns):
  """Rows (algorithm, seed, round, **columns, metrics) of metrics [seeds, rounds].

  With a `diverged` metric (0/1 per round, from the loop) every row also gets
  `diverged_round`, right after `columns`: the first round at which its run diverged, 0 if
  it never did (`runner.diverged_lines` names a run by the columns between `round` and
  `diverged_round`).
  """
  rows = []
  num_rounds = next(iter(metrics.values())).shape[1]
  for s, seed_value in enumerate(seeds):
    extra = {}
    if "diverged" in metrics:
      flags = metrics["diverged"][s] > 0
      extra["diverged_round"] = int(np.argmax(flags)) + 1 if flags.any() else 0
    for t in range(num_rounds):
      rows.append({"algorithm": algorithm, "seed": seed_value, "round": t + 1, **columns,
                   **extra, **{name: float(v[s, t]) for name, v in metrics.items()}})
  return rows
