"""fedavg-ft-fig2: does fine-tuning on another dataset change FedAvg's early layers less than
D-SGD's? (FedAvg-FT paper, Fig. 2: trained on CIFAR-100 with 5 classes per client,
fine-tuned on CIFAR-10; linear CKA of each layer before vs after fine-tuning.)

Training and new clients: `transfer` (FedAvg with tau local steps vs D-SGD at equal local
updates, `compared`; offline, digits with 2 classes per client, and new clients from a
mirrored, inverted and relabelled copy). Each of the `transfer_clients` new clients of a seed
fine-tunes the whole final model for `finetune_epochs` epochs on `finetune_samples` samples;
then for every layer (each conv or dense layer's output, the head's logits) the linear CKA
(`nn.cka`) of its outputs before and after the fine-tuning, on a fixed probe set of
`probe_samples` inputs of the new dataset's test split, averaged over the new clients. Both
final models are analysed by one program (an algorithm axis). Choices:
docs/papers/fedavg_ft.md.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_rep.core import loop
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import labels
from fedjax_rep.experiments import plotting
from fedjax_rep.experiments.recipe_registry import Recipe, register
from fedjax_rep.nn import cka
from fedjax_rep.recipes.fedavg_ft import compared
from fedjax_rep.recipes.fedavg_ft import transfer
from fedjax_rep.recipes.kit import shared


@dataclasses.dataclass(frozen=True)
class Config(transfer.Config):
  finetune_samples: int = cfg.positive_int("training samples of each new client", 100)
  probe_samples: int = cfg.positive_int("inputs of the new dataset's test split on which "
                                        "each layer's CKA is measured (all where it has "
                                        "fewer)", 1000)


@loop.jit_by_algorithm(static_argnames=("algorithm", "epochs"))
def analyse(algorithm, model, probe, new, hparams, keys, *, epochs: int):
  """What fine-tuning does to final global models `model` (flat, leaves [A, S, ...]: A
  algorithms of `algorithm`'s structure, S seeds), as one program: cka [A, S, J, L], the
  linear CKA of each of the L layers' outputs (`cka.layer_outputs`) on probe [S, P, ...]
  before and after each of the J new clients `new` ([S, J, ...]) fine-tuned the whole model
  for `epochs` epochs (`transfer.fine_tuned`, keys [S], the same for both algorithms);
  accuracy and accuracy_std [A, S], the new clients' test accuracy after it (mean and std
  over them)."""

  def one(flat, probe, new, key):
    before = cka.layer_outputs(algorithm.model, flat, probe)

    def measure(tuned):
      after = cka.layer_outputs(algorithm.model, tuned, probe)
      return jnp.stack([cka.linear_cka(before[layer], after[layer]) for layer in before])

    result = transfer.fine_tuned(algorithm, flat, new, hparams, key, epochs, measure)
    return {"cka": result["measure"], "accuracy": result["test_accuracy"],
            "accuracy_std": result["test_accuracy_std"]}

  return jax.vmap(jax.vmap(one), in_axes=(0, None, None, None))(model, probe, new, keys)


def run(config: Config, seeds: int, batch) -> list[dict]:
  seed_values = config.seed_values(seeds)
  clients, new, probe, model = transfer.prepared(config, seed_values, config.probe_samples)
  new = jax.tree.map(lambda leaf: leaf[:, 0], new)  # the one sample count: [S, J, ...]
  keys = shared.seed_keys(config.seed, seeds)  # training: the run keys; fine-tuning: data
  rows, finals, analysis = transfer.trained_and_analysed(
      config, clients, model, keys, batch, lambda algorithm, models, hparams: analyse(
          algorithm, models, probe, new, hparams, keys[:, 1], epochs=config.finetune_epochs))
  layer_names = [layer.removeprefix("body/") for layer in cka.layers(finals[0][0])]
  return rows + analysis_rows(analysis, seed_values, layer_names, config)


def analysis_rows(analysis: dict, seed_values: list[int], layer_names: list[str],
                  config: Config) -> list[dict]:
  """metrics.csv rows of the analysis: per algorithm and seed, one row per layer (layer, its
  index from the input, cka: the mean over the new clients, cka_std: their std) and one
  with the new clients' accuracy after fine-tuning (finetune_samples,
  new_client_accuracy, new_client_accuracy_std over the new clients)."""
  rows = []
  for a, name in enumerate(compared.COMPARED):
    for s, seed_value in enumerate(seed_values):
      base = transfer.row_base(name, seed_value, config)
      values = analysis["cka"][a, s]  # [J, L]
      rows += [{**base, "layer": layer, "layer_index": i,
                "cka": float(np.mean(values[:, i])), "cka_std": float(np.std(values[:, i]))}
               for i, layer in enumerate(layer_names)]
      rows.append({**base, "finetune_samples": config.finetune_samples,
                   "new_client_accuracy": float(analysis["accuracy"][a, s]),
                   "new_client_accuracy_std": float(analysis["accuracy_std"][a, s])})
  return rows


def summarize(rows, config: Config) -> list[dict]:
  """cka.csv: per algorithm and layer, the CKA's mean over the seeds whose run did not
  diverge and its std over them (`transfer.summary`), beside the new clients' accuracy after
  fine-tuning and the final test accuracy on the training clients."""
  table = transfer.summary(rows, "layer", ("cka",), config)
  accuracy = {e["algorithm"]: e for e in transfer.summary(
      rows, "finetune_samples", ("new_client_accuracy",), config)}
  for entry in table:
    tuned = accuracy.get(entry["algorithm"], {})
    entry["new_client_accuracy"] = tuned.get("new_client_accuracy", np.nan)
    entry["new_client_accuracy_std_over_seeds"] = tuned.get(
        "new_client_accuracy_std_over_seeds", np.nan)
  return table


def plot(rows, config: Config, file) -> None:
  fig, (training, bars) = plotting.figure(2, width=5.2, height=3.9)
  transfer.training_panel(training, rows)
  table = summarize(rows, config)
  layer_names = list(dict.fromkeys(e["layer"] for e in table))
  width = 0.38
  for a, name in enumerate(compared.COMPARED):
    entries = {e["layer"]: e for e in table if e["algorithm"] == name}
    xs = np.arange(len(layer_names)) + (a - 0.5) * width
    means = [entries.get(layer, {}).get("cka", np.nan) for layer in layer_names]
    stds = [entries.get(layer, {}).get("cka_std_over_seeds", np.nan) for layer in layer_names]
    accuracy = entries[layer_names[0]]["new_client_accuracy"] if entries else np.nan
    bars.bar(xs, means, width, yerr=stds, capsize=4, color=f"C{a}",
             label=f"{labels.label(name)} (new clients' accuracy after: {accuracy:.2f})")
  bars.set_xticks(range(len(layer_names)), layer_names)
  bars.set(ylim=(0, 1.05), xlabel="layer (input to output)",
           ylabel="linear CKA, before vs after fine-tuning",
           title=f"new clients fine-tune the model ({config.finetune_samples} samples, "
                 f"{config.finetune_epochs} epochs)")
  fig.suptitle("FedAvg-FT Fig. 2: how much fine-tuning changes each layer\n"
               + transfer.setting_text(config))
  plotting.save(fig, file)


RECIPE = register(Recipe(
    name="fedavg-ft-fig2",
    rank=45,
    docs="docs/papers/fedavg_ft.md#fig-2-cka-of-each-layer-after-fine-tuning-fedavg-ft-fig2",
    summary="FedAvg-FT Fig. 2: linear CKA of each layer before vs after fine-tuning on new "
            "clients from another dataset, FedAvg (tau local steps) vs D-SGD (digits offline; "
            "cifar100 -> cifar10 with the tfds files)",
    config=Config, quick={"rounds": 30, "num_clients": 20, "local_steps": 10}, run=run,
    plot=plot, default_seeds=5, summarize=summarize, summary_file="cka.csv"))
