"""fedavg-ft-neural: do local updates make FedAvg learn features that transfer to unseen
classes, where D-SGD's do not? (FedAvg-FT paper, Section 5.2, Figs. 4 and 5 left), on
scikit-learn's digits (offline).

Training: the digits of the first 10 - u classes (u = `unseen_classes` held out) over n
clients by Dir(0.6) label proportions; FedAvg with tau local SGD steps per round
(`FedAvgSteps`, T rounds) vs D-SGD (tau = 1) for tau T rounds: the same number of local
updates. Each client is tested on its own (seen-class) test samples with the global model.
Fig. 4: the class-by-class mean cosine similarity of the final body's features on the test
split, all 10 classes (`representation`), and its gap (mean diagonal minus mean
off-diagonal) within the seen and within the unseen classes. Fig. 5 left: per seed,
`unseen_clients` new clients get k training samples of every unseen class (a larger k extends a
smaller one's), fit a head from zero on the frozen final body (`finetune_epochs` of SGD)
and are tested on the unseen classes; accuracy vs k. Both final models are analysed by one
program (an algorithm axis). Choices: docs/papers/fedavg_ft.md.
"""

import dataclasses

import jax
import numpy as np

from fedjax_rep.core import loop
from fedjax_rep.core import tree
from fedjax_rep.data import digits, federated
from fedjax_rep.data import partition as partition_lib
from fedjax_rep.nn import models, representation
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import labels
from fedjax_rep.recipes.fedavg_ft import compared
from fedjax_rep.recipes.fedavg_ft.compared import COMPARED, local_steps
from fedjax_rep.recipes.kit import neural
from fedjax_rep.experiments import plotting
from fedjax_rep.recipes.kit import shared
from fedjax_rep.experiments.recipe_registry import Recipe, register


@dataclasses.dataclass(frozen=True)
class Config(compared.Training):
  """The training of `compared.Training` (30 clients) on the seen classes, and the new
  clients of the unseen ones."""
  dirichlet_alpha: float = neural.dirichlet_alpha(0.6)
  unseen_classes: int = cfg.positive_int("classes held out of training (the last ones): "
                                         "the new clients' classes", 2, low=2)
  model: str = cfg.choice("the network", "digits-mlp", ("digits-mlp", "digits-cnn"))
  finetune_samples: tuple = cfg.positive_int(
      "training samples k of each unseen class per new client (x-axis)", (1, 2, 5, 10, 20),
      sequence=True)
  finetune_epochs: int = cfg.positive_int("epochs of SGD on the new clients' heads", 50)
  unseen_clients: int = cfg.positive_int("new clients per seed holding the unseen classes "
                                         "(Fig. 5 left)", 5)

  def check(self):
    """The split must be possible on digits (checked on the labels: no training)."""
    _, y, _, y_test = digits.load(self.seed)
    seen = digits.NUM_CLASSES - self.unseen_classes
    if seen < 2:
      raise cfg.ConfigError(f"unseen_classes={self.unseen_classes} leaves {seen} class to "
                            f"train on; digits has {digits.NUM_CLASSES} classes")
    fewest = min(np.sum(y == c) for c in range(seen, digits.NUM_CLASSES))
    if max(self.finetune_samples) > fewest:
      raise cfg.ConfigError(f"finetune_samples={max(self.finetune_samples)} is more than the "
                            f"{fewest} training samples of an unseen class")
    try:
      partition_lib.dirichlet(y[y < seen], y_test[y_test < seen], self.num_clients,
                              self.dirichlet_alpha, self.seed)
    except ValueError as error:
      raise cfg.ConfigError(f"{error} (digits has {np.sum(y < seen)} training samples of the "
                            f"{seen} seen classes)") from None


def seed_data(config: Config, seed: int):
  """(training clients, probe set, new clients) of one seed: the seen classes split over
  config.num_clients clients (Dirichlet; `run` adds the validation split); the digits test
  split x [T, 8, 8, 1], y [T] (every class); ClientDatasets [K, J, ...] of J =
  config.unseen_clients new clients for each k of config.finetune_samples: k samples of each
  unseen class (client j's first k of its own shuffle of every class), all padded to u *
  max k rows, each tested on every test sample of the unseen classes."""
  x, y, x_test, y_test = digits.load(seed)
  seen = digits.NUM_CLASSES - config.unseen_classes
  parts, test_parts = partition_lib.dirichlet(y[y < seen], y_test[y_test < seen],
                                              config.num_clients, config.dirichlet_alpha, seed)
  clients = federated.client_datasets(
      x[y < seen], y[y < seen], parts, x_test[y_test < seen], y_test[y_test < seen],
      test_parts, digits.NUM_CLASSES)
  rng = np.random.default_rng([seed, 1])  # apart from the partition's stream
  shuffles = [[rng.permutation(np.flatnonzero(y == c)) for c in range(seen, digits.NUM_CLASSES)]
              for _ in range(config.unseen_clients)]
  unseen_test = np.flatnonzero(y_test >= seen)
  size = config.unseen_classes * max(config.finetune_samples)
  new = tree.stack([federated.client_datasets(
      x, y, [np.concatenate([s[:k] for s in own]) for own in shuffles], x_test, y_test,
      [unseen_test] * config.unseen_clients, digits.NUM_CLASSES, size=size)
      for k in config.finetune_samples])
  return clients, (x_test, y_test), new


@loop.jit_by_algorithm(static_argnames=("algorithm", "seen", "epochs"))
def analyse(algorithm, model, probe_x, probe_y, new, hparams, keys, *, seen: int, epochs: int):
  """Representation and transfer of final global models `model` (flat, leaves [A, S, ...]:
  A algorithms of `algorithm`'s structure, S seeds), all as one program:
  similarity [A, S, C, C] (`class_cosine_similarity` of the body's features on probe_x
  [S, T, ...] with labels probe_y [S, T]), gap_seen and gap_unseen [A, S] (its
  `similarity_gap` on the first `seen` classes and on the rest), and the accuracy [A, S, K]
  of the new clients `new` ([S, K, J, ...]) after `epochs` of head SGD on each one's body
  (`new_clients` with keys [S], the same for every k and algorithm), with its std over
  the new clients."""
  num_classes = new.num_classes

  def one(model, x, y, new, key):
    body = {p: v for p, v in model.items() if p.startswith("body/")}
    similarity = representation.class_cosine_similarity(algorithm.features(body, x), y,
                                                        num_classes)
    state = compared.final_state(model, key)  # FedAvg: nothing personal
    fine_tuned = jax.vmap(lambda d: algorithm.new_clients(state, d, hparams, key, epochs))(new)
    return {"similarity": similarity,
            "gap_seen": representation.similarity_gap(similarity[:seen, :seen]),
            "gap_unseen": representation.similarity_gap(similarity[seen:, seen:]),
            "accuracy": fine_tuned["test_accuracy"],
            "accuracy_std": fine_tuned["test_accuracy_std"]}

  return jax.vmap(jax.vmap(one), in_axes=(0, None, None, None, None))(
      model, probe_x, probe_y, new, keys)


def run(config: Config, seeds: int, batch, grid=None) -> list[dict]:
  """Rows of both algorithms and their analysis, for every combination of `grid` (traced
  keys: lr, momentum, weight_decay; None: config's values); the combinations of an
  algorithm train by `batch` as one program."""
  seed_values = config.seed_values(seeds)
  per_seed = {s: seed_data(config, s) for s in seed_values}
  clients = neural.stacked_datasets(config, [{"seed": s} for s in seed_values],
                                    lambda run: per_seed[run["seed"]][0])
  new = tree.stack([per_seed[s][2] for s in seed_values])
  probe_x, probe_y = tree.stack([per_seed[s][1] for s in seed_values])
  model = models.make_model(config.model, digits.NUM_CLASSES, precision=config.precision)
  keys = shared.seed_keys(config.seed, seeds)  # training: the run keys; fine-tuning: data
  combos = grid or [{}]
  settings = [neural.hparams(cfg.apply(config, combo)) for combo in combos]
  rows, finals, trained_metrics, algorithm = compared.train(config, clients, model, settings,
                                                            keys, combos, batch)
  seen = digits.NUM_CLASSES - config.unseen_classes
  for c, (combo, hparams) in enumerate(zip(combos, settings)):
    # One program for both final models: the last algorithm's structure serves both.
    analysis = batch.unit("analysis" if grid is None else f"analysis-{c}",
                          lambda: jax.device_get(analyse(
                              algorithm, tree.stack([f[c] for f in finals]), probe_x,
                              probe_y, new, hparams, keys[:, 1], seen=seen,
                              epochs=config.finetune_epochs)))
    analysis = {k: np.stack([shared.nan_where_diverged(v[a], metrics[c])  # NaN: diverged
                             for a, metrics in enumerate(trained_metrics)])
                for k, v in analysis.items()}
    rows += analysis_rows(analysis, seed_values, config, **combo)
  return rows


def analysis_rows(analysis: dict, seed_values: list[int], config: Config,
                  **columns) -> list[dict]:
  """metrics.csv rows of the analysis: per algorithm and seed, one row per class pair
  (class_a, class_b, cosine_similarity), one with the similarity gaps, and one per k
  (finetune_samples, new_client_accuracy and its std over the new clients); each with
  `columns` (a grid's combination)."""
  rows = []
  for a, name in enumerate(COMPARED):
    steps = local_steps(name, config)
    for s, seed_value in enumerate(seed_values):
      base = {"algorithm": name, "seed": seed_value,
              "round": compared.final_round(name, config), "local_steps": steps, **columns}
      matrix = analysis["similarity"][a, s]
      rows += [{**base, "class_a": i, "class_b": j, "cosine_similarity": float(matrix[i, j])}
               for i in range(matrix.shape[0]) for j in range(matrix.shape[1])]
      rows.append({**base, "similarity_gap_seen": float(analysis["gap_seen"][a, s]),
                   "similarity_gap_unseen": float(analysis["gap_unseen"][a, s])})
      rows += [{**base, "finetune_samples": k,
                "new_client_accuracy": float(analysis["accuracy"][a, s, j]),
                "new_client_accuracy_std": float(analysis["accuracy_std"][a, s, j])}
               for j, k in enumerate(config.finetune_samples)]
  return rows


def column_mean(rows, name: str, column: str) -> float:
  """The mean of `column` over the rows of algorithm `name` that have it (NaN: none)."""
  values = [r[column] for r in rows if r["algorithm"] == name and r.get(column) is not None]
  return float(np.mean(values)) if values else np.nan


def summarize(rows, config: Config) -> list[dict]:
  """Per algorithm and k: the new clients' accuracy (mean over the seeds whose run did not
  diverge, `seeds` of them, and its std over them), beside the algorithm's final test
  accuracy on the training clients and its similarity gaps (means over those seeds);
  `diverged`: how many seeds were left out because their run diverged (all: NaN). With
  held-out clients (`new_clients`), also their final accuracy and participation_gap (the
  final test accuracy less it)."""
  table = []
  for name in COMPARED:
    diverged = {r["seed"] for r in rows if r["algorithm"] == name and r.get("diverged_round")}
    kept = [r for r in rows if r["algorithm"] == name and r["seed"] not in diverged]
    final_round = max(r["round"] for r in rows if r["algorithm"] == name)
    final = lambda key: [r[key] for r in kept
                         if r["round"] == final_round and r.get(key) is not None]
    test, new = final("test_accuracy"), final("new_accuracy")
    held = {"final_new_accuracy": float(np.mean(new)),
            "participation_gap": float(np.mean(test) - np.mean(new))} if new and test else {}
    for k in config.finetune_samples:
      accuracy = [r["new_client_accuracy"] for r in kept if r.get("finetune_samples") == k]
      table.append({"algorithm": name, "finetune_samples": k,
                    "new_client_accuracy": float(np.mean(accuracy)) if accuracy else np.nan,
                    "new_client_accuracy_std_over_seeds": float(np.std(accuracy)) if accuracy
                    else np.nan,
                    "seeds": len(accuracy), "diverged": len(diverged),
                    "final_test_accuracy": float(np.mean(test)) if test else np.nan, **held,
                    "similarity_gap_seen": column_mean(kept, name, "similarity_gap_seen"),
                    "similarity_gap_unseen": column_mean(kept, name,
                                                         "similarity_gap_unseen")})
  return table


def mean_similarity(rows, name: str) -> np.ndarray:
  """The class similarity matrix [C, C] of algorithm `name`, the mean over the seeds whose
  run did not diverge (NaN where every run diverged)."""
  entries = [r for r in rows if r["algorithm"] == name and "cosine_similarity" in r]
  size = max(r["class_a"] for r in entries) + 1
  sums, counts = np.zeros((size, size)), np.zeros((size, size))
  for r in entries:
    if np.isfinite(r["cosine_similarity"]):  # NaN: a diverged run
      sums[r["class_a"], r["class_b"]] += r["cosine_similarity"]
      counts[r["class_a"], r["class_b"]] += 1
  return np.divide(sums, counts, out=np.full_like(sums, np.nan), where=counts > 0)


def similarity_panel(fig, ax, matrix: np.ndarray, seen: int, diverging: bool) -> None:
  """A class similarity matrix [C, C] as an annotated image with a colour bar: on [0, 1],
  or (diverging) on a blue-red scale symmetric about 0; dashes after the seen classes."""
  limit = max(float(np.max(np.abs(matrix), initial=0.0, where=np.isfinite(matrix))),
              1e-3) if diverging else 1.0
  image = ax.imshow(matrix, vmin=-limit if diverging else 0.0, vmax=limit,
                    cmap="RdBu_r" if diverging else "viridis")
  for i, j in np.ndindex(matrix.shape):
    dark = abs(matrix[i, j]) > 0.6 * limit if diverging else matrix[i, j] < 0.6
    ax.text(j, i, f"{matrix[i, j]:.2f}", ha="center", va="center", fontsize=6,
            color="white" if dark else "black")
  for edge in (ax.axhline, ax.axvline):
    edge(seen - 0.5, color="red", lw=1.2, ls="--")
  ax.set_xticks(range(matrix.shape[0]))
  ax.set_yticks(range(matrix.shape[0]))
  ax.set(xlabel=f"class (unseen: {seen}-{matrix.shape[0] - 1}, past the dashes)",
         ylabel="class")
  fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)


def plot(rows, config: Config, file) -> None:
  fig, axes = plotting.figure(3, width=4.4, height=3.9, rows=2)
  (loss, test, transfer), (*matrices, difference) = axes[0], axes[1]
  training = [r for r in rows if "train_loss" in r]
  for name in COMPARED:
    label = labels.label(name)
    plotting.line(loss, training, "local_updates", "train_loss", label, along="round",
                  algorithm=name)
    plotting.line(test, training, "local_updates", "test_accuracy", label, along="round",
                  algorithm=name)
    plotting.line(transfer, rows, "finetune_samples", "new_client_accuracy", label,
                  algorithm=name)
  loss.set(xlabel="local updates per client (rounds x tau)", ylabel="local training loss",
           yscale="log", title="training")
  test.set(xlabel="local updates per client (rounds x tau)",
           ylabel="test accuracy (seen classes)", title="global model on its clients")
  transfer.set(xscale="log", xlabel="samples per unseen class k",
               ylabel="new clients' test accuracy",
               title=f"new clients: a head on the body ({config.finetune_epochs} epochs)")
  transfer.set_xticks(config.finetune_samples, [str(k) for k in config.finetune_samples])
  seen = digits.NUM_CLASSES - config.unseen_classes
  for ax, name in zip(matrices, COMPARED):
    similarity_panel(fig, ax, mean_similarity(rows, name), seen, diverging=False)
    ax.set_title(f"{labels.label(name)}: feature cosine similarity\ngap seen "
                 f"{column_mean(rows, name, 'similarity_gap_seen'):.2f}, unseen "
                 f"{column_mean(rows, name, 'similarity_gap_unseen'):.2f}")
  similarity_panel(fig, difference, mean_similarity(rows, "fedavg-steps")
                   - mean_similarity(rows, "d-sgd"), seen, diverging=True)
  difference.set_title("FedAvg minus D-SGD")
  fig.suptitle(f"digits, {config.model}: {seen} classes over n={config.num_clients} clients "
               f"(Dir({config.dirichlet_alpha})), r={config.participation}; FedAvg "
               f"tau={config.local_steps} x {config.rounds} rounds vs D-SGD "
               f"1 x {config.rounds * config.local_steps} rounds")
  plotting.save(fig, file)


RECIPE = register(Recipe(
    name="fedavg-ft-neural",
    rank=60,
    docs="docs/papers/fedavg_ft.md#figs-4-and-5-features-that-transfer-fedavg-ft-neural",
    summary="FedAvg-FT Figs. 4-5 on digits: FedAvg (tau local steps) vs D-SGD at equal local "
            "updates; feature cosine similarity; new clients of unseen classes fine-tune "
            "a head",
    config=Config, quick={"rounds": 30, "num_clients": 20, "local_steps": 10}, run=run,
    plot=plot, default_seeds=3, summarize=summarize, traced=("lr", "momentum", "weight_decay")))
