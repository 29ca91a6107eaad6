"""fedavg-ft-fig5: do FedAvg's models fine-tune better than D-SGD's on new clients from another
dataset? (FedAvg-FT paper, Fig. 5 right: trained on CIFAR-100 with C classes per client,
fine-tuned on new clients from CIFAR-10 for 10 epochs of varying numbers of samples; average
accuracy, std over five trials of five new clients. Fig. 5 left is fedavg-ft-neural's.)

Training and new clients: `transfer` (FedAvg with tau local steps vs D-SGD at equal local
updates, `compared`; offline, digits with 2 classes per client, and new clients from a
mirrored, inverted and relabelled copy). Per seed, `transfer_clients` new clients get k
samples of the new dataset for each k of `finetune_samples` (a larger k extends a smaller
one's draw), fine-tune for `finetune_epochs` epochs (`finetune`: the whole model, the
paper's, or a head from zero on the frozen body, the package's new-client probe
`new_clients`) and are tested on their own test samples; accuracy vs k. Both final models
are analysed by one program (an algorithm axis). Choices: docs/papers/fedavg_ft.md.
"""

import dataclasses

import jax
import numpy as np

from fedjax_rep.core import loop
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import labels
from fedjax_rep.experiments import plotting
from fedjax_rep.experiments.recipe_registry import Recipe, register
from fedjax_rep.recipes.fedavg_ft import compared
from fedjax_rep.recipes.fedavg_ft import transfer
from fedjax_rep.recipes.kit import shared

FINETUNE = ("model", "head")  # what a new client fine-tunes


@dataclasses.dataclass(frozen=True)
class Config(transfer.Config):
  finetune_samples: tuple = cfg.positive_int(
      "training samples k of each new client, its samples per epoch (x-axis)",
      (10, 20, 50, 100, 200), sequence=True)
  finetune: str = cfg.choice("what a new client fine-tunes: the whole model (the paper's) or "
                             "a head from zero on the frozen body (the package's new-client "
                             "probe)", "model", FINETUNE)


@loop.jit_by_algorithm(static_argnames=("algorithm", "epochs", "finetune"))
def analyse(algorithm, model, new, hparams, keys, *, epochs: int, finetune: str):
  """The accuracy [A, S, K] of the new clients `new` ([S, K, J, ...]) after `epochs` epochs
  of fine-tuning final global models `model` (flat, leaves [A, S, ...]: A algorithms of
  `algorithm`'s structure, S seeds), and its std over the J new clients, as one program:
  finetune="model", the whole model (`transfer.fine_tuned`); "head", a head from zero on the
  frozen body (`algorithm.new_clients`); keys [S], the same for every k and algorithm."""

  def one(flat, new, key):
    def tuned(data):
      if finetune == "head":
        return algorithm.new_clients(compared.final_state(flat, key), data, hparams, key,
                                     epochs)
      return transfer.fine_tuned(algorithm, flat, data, hparams, key, epochs)

    result = jax.vmap(tuned)(new)
    return {"accuracy": result["test_accuracy"], "accuracy_std": result["test_accuracy_std"]}

  return jax.vmap(jax.vmap(one), in_axes=(0, None, None))(model, new, keys)


def run(config: Config, seeds: int, batch) -> list[dict]:
  seed_values = config.seed_values(seeds)
  clients, new, _, model = transfer.prepared(config, seed_values)
  keys = shared.seed_keys(config.seed, seeds)  # training: the run keys; fine-tuning: data
  rows, _, analysis = transfer.trained_and_analysed(
      config, clients, model, keys, batch, lambda algorithm, models, hparams: analyse(
          algorithm, models, new, hparams, keys[:, 1], epochs=config.finetune_epochs,
          finetune=config.finetune))
  return rows + analysis_rows(analysis, seed_values, config)


def analysis_rows(analysis: dict, seed_values: list[int], config: Config) -> list[dict]:
  """metrics.csv rows of the analysis: per algorithm, seed and k, the new clients' accuracy
  after fine-tuning (finetune_samples, new_client_accuracy: the mean over the new clients,
  new_client_accuracy_std: their std)."""
  rows = []
  for a, name in enumerate(compared.COMPARED):
    for s, seed_value in enumerate(seed_values):
      base = transfer.row_base(name, seed_value, config)
      rows += [{**base, "finetune_samples": k,
                "new_client_accuracy": float(analysis["accuracy"][a, s, j]),
                "new_client_accuracy_std": float(analysis["accuracy_std"][a, s, j])}
               for j, k in enumerate(config.finetune_samples)]
  return rows


def summarize(rows, config: Config) -> list[dict]:
  """transfer.csv: per algorithm and k, the new clients' accuracy: its mean over the seeds
  whose run did not diverge (each seed's the mean over its new clients) and its std over
  them, the paper's error bar (`transfer.summary`); and its std over every new client of
  those seeds (new_client_accuracy_std_over_clients, pooled); beside the final test
  accuracy on the training clients."""
  table = transfer.summary(rows, "finetune_samples", ("new_client_accuracy",), config)
  for entry in table:
    within = [r["new_client_accuracy_std"] for r in rows
              if r["algorithm"] == entry["algorithm"]
              and r.get("finetune_samples") == entry["finetune_samples"]
              and r.get("new_client_accuracy_std") is not None]
    within = [v for v in within if np.isfinite(v)]
    spread = entry["new_client_accuracy_std_over_seeds"]
    entry["new_client_accuracy_std_over_clients"] = (
        float(np.sqrt(np.mean(np.square(within)) + spread ** 2)) if within else np.nan)
  return table


def plot(rows, config: Config, file) -> None:
  fig, (training, transfer_ax) = plotting.figure(2, width=5.2, height=3.9)
  transfer.training_panel(training, rows)
  table = summarize(rows, config)
  for a, name in enumerate(compared.COMPARED):
    entries = [e for e in table if e["algorithm"] == name]
    transfer_ax.errorbar([e["finetune_samples"] for e in entries],
                         [e["new_client_accuracy"] for e in entries],
                         yerr=[e["new_client_accuracy_std_over_seeds"] for e in entries],
                         color=f"C{a}", marker="o", ms=4, capsize=4, lw=1.5,
                         label=f"{labels.label(name)}: new clients")
  what = "the whole model" if config.finetune == "model" else "a head on the frozen body"
  transfer_ax.set(xscale="log", xlabel="new client's samples (per epoch)",
                  ylabel="new clients' test accuracy",
                  title=f"new clients fine-tune {what} ({config.finetune_epochs} epochs)")
  transfer_ax.set_xticks(config.finetune_samples, [str(k) for k in config.finetune_samples])
  fig.suptitle("FedAvg-FT Fig. 5 right: fine-tuning on new clients from another dataset\n"
               + transfer.setting_text(config))
  plotting.save(fig, file)


RECIPE = register(Recipe(
    name="fedavg-ft-fig5",
    rank=65,
    docs="docs/papers/fedavg_ft.md#fig-5-right-new-clients-from-another-dataset-fedavg-ft-fig5",
    summary="FedAvg-FT Fig. 5 right: new clients from another dataset fine-tune FedAvg's "
            "(tau local steps) and D-SGD's models; accuracy vs samples (digits offline; "
            "cifar100 -> cifar10 with the tfds files)",
    config=Config, quick={"rounds": 30, "num_clients": 20, "local_steps": 10}, run=run,
    plot=plot, default_seeds=5, summarize=summarize, summary_file="transfer.csv"))
