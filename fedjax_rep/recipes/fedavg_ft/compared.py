"""FedAvg with tau local SGD steps against D-SGD at equal local updates: the training that
FedAvg-FT's neural recipes share (fedavg-ft-neural, fedavg-ft-fig2, fedavg-ft-fig5).

Both algorithms of `COMPARED` train the same model on the same clients: FedAvg
(`fedavg-steps`, `nn/fedavg_steps.py`) takes tau local SGD steps a round for T rounds, D-SGD
(`d-sgd`) one step a round for tau T rounds, evaluated at FedAvg's numbers of local updates:
the same number of local updates, the paper's fairness rule (Section 5.2). `Training` holds
their configuration fields, `train` runs both through the batch runner and keeps each run's
final global model, and `final_state` is the state that an algorithm's adaptation hooks
(`new_clients`) take from such a model.
"""

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_rep.core.cohort import cohort_size
from fedjax_rep.experiments import config as cfg
from fedjax_rep.nn import algorithms as nn_algorithms
from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn.algorithm import NNState
from fedjax_rep.recipes.kit import neural
from fedjax_rep.recipes.kit import shared
from fedjax_rep.recipes.kit import summaries

COMPARED = ("d-sgd", "fedavg-steps")  # the algorithms, in this order


def local_steps(name: str, config) -> int:
  """Local steps per round of algorithm `name`: 1 for D-SGD, tau for FedAvg."""
  return 1 if name == "d-sgd" else config.local_steps


@dataclasses.dataclass(frozen=True)
class Training(cfg.Config):
  """The training fields of FedAvg-FT's neural recipes: tau = 20 local steps, 100 FedAvg
  rounds (D-SGD: 2000), r = 0.2 of n = 30 clients, plain SGD (lr 0.05, batch 10)."""
  UNSHARDED = "FedAvg-FT's neural runs (D-SGD and FedAvg, one program)"
  num_clients: int = cfg.num_clients(30)
  local_steps: int = cfg.positive_int("FedAvg's local SGD steps tau per round (D-SGD: one "
                                      "step a round, tau times the rounds)", 20)
  rounds: int = cfg.positive_int("FedAvg's communication rounds T (D-SGD runs tau T)", 100)
  participation: float = cfg.participation(0.2)
  batch_size: int = neural.batch_size()
  lr: float = cfg.lr(0.05, "step size of local SGD (training and fine-tuning)")
  momentum: float = neural.momentum(0.0)
  weight_decay: float = neural.weight_decay()
  eval_every: int = neural.eval_every(10)
  validation_fraction: float = neural.validation_fraction()
  new_clients: float = neural.new_clients()
  new_epochs: int = neural.new_epochs()
  client_group: int = neural.client_group()
  precision: str = neural.precision()
  seed: int = cfg.seed()

  def record(self, swept: cfg.Sweep) -> dict:
    """What config.json records of the precision (`neural.precision_record`)."""
    return neural.precision_record(self, swept)


def train(config: Training, clients, model, settings: list, keys, combos: list[dict],
          batch) -> tuple[list[dict], list[list[dict]], list[list[dict]], object]:
  """Both algorithms of COMPARED (`model`, a Classifier) on `clients` (the seeds' runs
  stacked, `neural.stacked_datasets`) with every hparams of `settings` (one per combination
  of `combos`, its metrics.csv columns), the run keys of keys [S, 3] (`shared.seed_keys`),
  each algorithm's settings as one program of `batch`.

  Returns (rows, finals, metrics, algorithm): the metrics.csv rows of training
  (`summaries.rows`, with local_steps, local_updates = round x steps and the combination's
  columns); finals[a][c], the final global models of algorithm a with setting c (flat
  params, leaves [S, ...]); metrics[a][c], their loop metrics ([S, rounds], `diverged`
  among them); the last algorithm built (its structure serves both in one analysis
  program: they share the model and differ only in local steps)."""
  seed_values = config.seed_values(len(keys))
  cohort = cohort_size(neural.training_count(config, config.num_clients),
                       config.participation)
  rows, finals, trained_metrics = [], [], []
  for name in COMPARED:
    steps = local_steps(name, config)
    algorithm = nn_algorithms.make_algorithm(
        name, model=model, cohort=cohort, batch_size=config.batch_size,
        client_group=config.client_group, local_steps=config.local_steps)  # d-sgd: 1 step
    # D-SGD runs tau times the rounds, evaluated at FedAvg's numbers of local updates.
    scale = config.local_steps // steps
    results = batch.train(
        name, neural.with_new_clients(algorithm, config, clients), clients, settings,
        shared.run_keys(keys), config.rounds * scale,
        eval_every=config.eval_every * scale,
        keep=lambda state: {"model": params_lib.unflatten(state.shared)},
        members=[shared.members(name, seed_values, local_steps=steps, **combo)
                 for combo in combos])
    for combo, result in zip(combos, results):
      algorithm_rows = summaries.rows(name, seed_values, result, local_steps=steps, **combo)
      for r in algorithm_rows:
        r["local_updates"] = r["round"] * steps
      rows += algorithm_rows
    finals.append([params_lib.flatten(result["model"]) for result in results])
    trained_metrics.append([result["metrics"] for result in results])
  return rows, finals, trained_metrics, algorithm


def final_round(name: str, config: Training) -> int:
  """The last round of algorithm `name`'s runs: T for FedAvg, tau T for D-SGD."""
  return config.rounds * config.local_steps // local_steps(name, config)


def final_state(model: dict, key) -> NNState:
  """The state of a run whose server holds the global model `model` (flat params) and whose
  clients hold nothing personal (FedAvg and D-SGD), for the adaptation hooks
  (`Personalized.new_clients`); `key` stands in for the evaluation key, which they do not
  use."""
  return NNState(shared=model, personal={}, eval_key=jax.random.key_data(key), server={},
                 round=jnp.zeros((), jnp.int32))
