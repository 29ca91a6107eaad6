"""What the FLUTE recipes share: configuration, the (N x seed) vmapped sweeps, rows, panels.

Problems (App. C.1): Phi = U Lambda V^T with a configurable spectrum, N samples per client,
x ~ N(0, I_d), label noise of variance 0.3. Every seed draws its own Phi (the same Phi for
every N of a seed, and the first N samples of a client are shared across N). Datasets with
different N are padded to the largest N (with per-client counts), so one vmapped program
runs every N and seed of a (k, M) cell; only k and M, which change array shapes, loop.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import loop
from fedjax_rep.linear import underparam
from fedjax_rep.linear.fedrep import FedRep
from fedjax_rep.linear.flute import LOSSES
from fedjax_rep.linear.hparams import LinearHparams
from fedjax_rep.linear.algorithms import make_algorithm
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import labels
from fedjax_rep.recipes.kit import linear
from fedjax_rep.experiments import plotting
from fedjax_rep.recipes.kit import shared

NOISE_STD = 0.3 ** 0.5  # App. C.1: label noise of variance 0.3
DEFAULT_ALGORITHMS = ("flute", "fedrep-ri", "fedrep")


@dataclasses.dataclass(frozen=True)
class ProblemConfig(linear.Problem):
  """Fields every FLUTE recipe has."""
  UNSHARDED = "FLUTE (its neural-collapse step runs over the whole cohort)"
  spectrum: str = cfg.choice("singular values of Phi: linear (2d - i + 1, App. C.1), "
                             "geometric (2d 0.7^(i-1)), gaussian (phi_i ~ N(0, I), Sec. 7.1)",
                             "linear", underparam.SPECTRA)
  noise_std: float = linear.noise_std(NOISE_STD)
  rounds: int = cfg.rounds(1000)
  lr: float = cfg.lr(0.03, "step size eta_l of every algorithm's data step (B and heads)")
  reg_lr: float = cfg.lr(0.03, "FLUTE's regulariser step size eta_r (theory: = lr)")
  gamma2: float = cfg.positive_float("FLUTE's weight gamma2 of ||B^T B||^2 + ||W W^T||^2",
                                     0.125)
  loss: str = cfg.choice("FLUTE's loss normalisation: half-mean (1/2N, stable at eta=0.03) or "
                         "mean (1/N, Algorithm 1 as printed)", "half-mean", tuple(LOSSES))
  blowup: float = cfg.nonnegative_float(
      "a run diverges when its model error (FedRep: train loss) exceeds blowup x its "
      "first-round value, or becomes non-finite; 0: no bound", loop.DEFAULT_BLOWUP)


@dataclasses.dataclass(frozen=True)
class GridConfig(ProblemConfig):
  """Fields of the recipes that compare algorithms over a (k, M, N) grid."""
  gamma1: float = cfg.positive_float("FLUTE's weight gamma1 of -||B W||^2 (theory: 2 gamma2)",
                                     0.25)
  algorithms: tuple = cfg.choice("algorithms to compare", DEFAULT_ALGORITHMS, DEFAULT_ALGORITHMS,
                                 sequence=True)

  def check(self):
    check_rep_dims(self)


@jax.jit(static_argnames=("num_clients", "dim", "samples", "spectrum"))
def problem_data(keys, noise_std, *, num_clients, dim, samples: tuple, spectrum):
  """FixedData with leading axis len(samples) * seeds (N-major): for each N and seed, Phi
  [M, d] of the seed and N samples per client, padded to max(samples) rows; no B* yet (it
  depends on k: see `with_rep_dim`, so this program serves every k)."""

  def one(key_problem, key_data, n):
    models = underparam.make_models(key_problem, num_clients, dim, spectrum)
    return underparam.make_data(key_data, models, None, n, noise_std, pad_to=max(samples))

  per_n = [jax.vmap(functools.partial(one, n=n))(keys[:, 0], keys[:, 1]) for n in samples]
  return jax.tree.map(lambda *x: jnp.concatenate(x), *per_n)


@jax.jit(static_argnames=("rep_dim",))
def with_rep_dim(data, rep_dim):
  """(data with B* = the top-k subspace of each run's Phi, the rank-k floors [runs])."""
  subspaces = jax.vmap(underparam.top_subspace, in_axes=(0, None))(data.models, rep_dim)
  floors = jax.vmap(underparam.rank_k_error, in_axes=(0, None))(data.models, rep_dim)
  return data.replace(B_star=subspaces), floors


def hparams(config, gamma1: np.ndarray) -> LinearHparams:
  """Hparams of the shape of gamma1 (numpy: no eager device ops)."""
  full = lambda v: np.full(gamma1.shape, v, np.float32)
  return LinearHparams(lr=full(config.lr), head_lr=full(config.lr), reg_lr=full(config.reg_lr),
                       gamma1=np.asarray(gamma1, np.float32), gamma2=full(config.gamma2))



def programs(names, *, rep_dim, num_clients, loss, gamma1s):
  """{program: [(name, algorithm, gamma1), ...]}: the runs of each compiled program.
  FedRep and FedRep(RI) differ only in B0, so they share the rounds of one FedRep program
  (each run starts from its own algorithm's initial state); FLUTE runs every gamma1."""
  groups = {}
  for name in names:
    algorithm = make_algorithm(name, rep_dim=rep_dim, cohort=num_clients, loss=loss)
    program = (dataclasses.replace(algorithm, init_method="moments", name="fedrep")
               if isinstance(algorithm, FedRep) else algorithm)
    for gamma1 in (gamma1s if name == "flute" else gamma1s[:1]):
      groups.setdefault(program, []).append((name, algorithm, gamma1))
  return groups


def run_cell(config, keys, batch, *, rep_dim, num_clients, samples, algorithms,
             gamma1s, **columns):
  """Rows of every algorithm (and every gamma1 for FLUTE) x N x seed of one (k, M) cell.

  Each program (see `programs`) runs its runs (settings) over N x seed, by `batch`; every
  row also carries the seed's rank-k floor `rank_k_error`.
  """
  seeds = keys.shape[0]
  seed_values = config.seed_values(seeds)
  data = problem_data(keys, np.float32(config.noise_std), num_clients=num_clients,
                      dim=config.dim, samples=tuple(samples), spectrum=config.spectrum)
  data, floors = jax.device_get(with_rep_dim(data, rep_dim))
  block_keys = shared.run_keys(keys, np.tile(np.arange(seeds), len(samples)))  # N-major
  rows = []
  for program, runs in programs(algorithms, rep_dim=rep_dim, num_clients=num_clients,
                                loss=config.loss, gamma1s=gamma1s).items():
    extras = [{"gamma1": float(gamma1)} if name == "flute" else {} for name, _, gamma1 in runs]
    cell = f"{program.name}-k{rep_dim}-M{num_clients}"
    results = batch.train(
        cell, program, data, [hparams(config, np.asarray(gamma1)) for _, _, gamma1 in runs],
        block_keys, config.rounds, blowup=config.blowup or None,
        starts=[algorithm for _, algorithm, _ in runs], members=[
            [m for samples_n in samples for m in shared.members(
                name, seed_values, rep_dim=rep_dim, num_clients=num_clients,
                samples_per_client=samples_n, **columns, **extra)]
            for (name, _, _), extra in zip(runs, extras)])
    for (name, _, _), extra, result in zip(runs, extras, results):
      for n, samples_n in enumerate(samples):
        part = {k: v[n * seeds:(n + 1) * seeds] for k, v in result["metrics"].items()}
        for row in shared.round_rows(name, seed_values, part, rep_dim=rep_dim,
                                     num_clients=num_clients, samples_per_client=samples_n,
                                     **columns, **extra):
          row["rank_k_error"] = float(floors[row["seed"] - config.seed])
          rows.append(row)
  return rows


def _stats(values):
  return float(np.mean(values)), float(np.std(values)), len(values)


def final_table(rows, cell_keys=("rep_dim", "num_clients", "samples_per_client")):
  """Final-round model_error per cell, one gamma1 per algorithm (flute-fig1/3):
  [{**cell, algorithm: (mean, std, seeds), ..., "floor": (mean, std, seeds)}]."""
  last = max(r["round"] for r in rows)
  cells = {}
  for r in rows:
    if r["round"] == last:
      cell = cells.setdefault(tuple(r[k] for k in cell_keys), {"floor": {}})
      cell.setdefault(r["algorithm"], []).append(r["model_error"])
      cell["floor"][r["seed"]] = r["rank_k_error"]
  table = []
  for key, cell in sorted(cells.items()):
    floors = list(cell.pop("floor").values())
    table.append({**dict(zip(cell_keys, key)), "floor": _stats(floors),
                  **{name: _stats(v) for name, v in cell.items()}})
  return table


def markdown_table(rows, algorithms=DEFAULT_ALGORITHMS) -> str:
  """`final_table` as a markdown table of mean ± std over seeds."""
  header = ["k", "M", "N", *(labels.label(a) for a in algorithms), "rank-k floor", "seeds"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for cell in final_table(rows):
    values = [f"{cell[a][0]:.3f} ± {cell[a][1]:.3f}" if a in cell else "" for a in algorithms]
    lines.append("| " + " | ".join(map(str, [cell["rep_dim"], cell["num_clients"],
                                             cell["samples_per_client"], *values,
                                             f"{cell['floor'][0]:.3f}",
                                             cell["floor"][2]])) + " |")
  return "\n".join(lines)


def panel(ax, rows, lines, title):
  """model_error vs round: one line per (label, row filter) in `lines`, and the rank-k
  floor (mean over seeds) as a dashed line."""
  for label, where in lines:
    plotting.line(ax, rows, "round", "model_error", label, **where)
  floors = {r["seed"]: r["rank_k_error"] for r in plotting.select(rows, **lines[0][1])}
  if floors:
    ax.axhline(np.mean(list(floors.values())), color="black", ls="--", lw=1,
               label="rank-k floor")
  ax.set(title=title, xlabel="communication round", ylabel=r"$(1/M)\sum_i\|Bw_i-\phi_i\|$")


def check_rep_dims(config):
  ks = config.rep_dim if isinstance(config.rep_dim, tuple) else (config.rep_dim,)
  if max(ks) > config.dim:
    raise cfg.ConfigError(f"rep_dim={max(ks)} is out of range: every rep_dim must be an "
                          f"integer in [1, dim={config.dim}] (k <= d)")


def run_grid(config, seeds, batch, *, rep_dims, client_counts, samples):
  """Rows of config.algorithms (a GridConfig) on every (k, M) cell, each cell vmapped over
  N x seed."""
  keys = shared.seed_keys(config.seed, seeds)
  rows = []
  for k in rep_dims:
    for m in client_counts:
      rows += run_cell(config, keys, batch, rep_dim=k, num_clients=m, samples=samples,
                       algorithms=config.algorithms, gamma1s=(config.gamma1,))
  return rows


def grid_figure(rows, config, file, *, rep_dims, client_counts, samples, title):
  """One panel per (k, M, N): rows k, columns (M, N); with one (M, N) (flute-fig1), the k
  panels in a near-square grid."""
  columns = [(m, n) for m in client_counts for n in samples]
  cells = [(k, m, n) for k in rep_dims for m, n in columns]
  fig, axes = plotting.grid_of(len(cells), len(columns) if len(columns) > 1 else None)
  for ax, (k, m, n) in zip(axes, cells):
    cell = plotting.select(rows, rep_dim=k, num_clients=m, samples_per_client=n)
    panel(ax, cell, [(labels.label(a), {"algorithm": a}) for a in config.algorithms],
          f"k={k}, M={m}, N={n}")
  fig.suptitle(title)
  plotting.save(fig, file)
