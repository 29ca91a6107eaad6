"""The neural algorithms' evaluation: every client tested on its own test set (and on its
own validation split where the data have one), and the metrics over the clients
(`accuracy_metrics`)."""

import jax
import jax.numpy as jnp

from fedjax_rep.nn import sharded
from fedjax_rep.nn import train


def evaluate(algorithm, state, data, hparams) -> dict:
  """Every client tested on its own test set with its own params (`eval_params`):
  `accuracy_metrics` over all clients, or with eval_clients="cohort" over the last round's
  cohort (those without test samples left out). Where the data have a validation split
  (`data.validation.split`; `core.protocols.ClassificationData.has_validation`), the same
  params (computed once per client) are also tested on the client's validation rows:
  `accuracy_metrics` with prefix "val_" (val_accuracy, ..., val_clients; clients without
  validation samples left out). Sharded, each device tests the clients it holds."""
  validation = data.has_validation
  splits = [("test_", data.test_counts)] + ([("val_", data.val_counts)] if validation else [])
  splits = [(prefix, counts if state.cohort is None else jnp.where(state.cohort, counts, 0))
            for prefix, counts in splits]

  def tested(state, data, offset):  # per split, `train.tested` [n'] of offset + range(n')
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
        jax.random.wrap_key_data(state.eval_key), offset + jnp.arange(data.num_clients))

    def client(args, x, y, count, *held):  # held: x_test, y_test, test_count[, x_val, ...]
      personal, key = args
      flat = algorithm.eval_params(state.shared, personal, x, y, count, key, hparams)
      return [train.tested(algorithm.logits(flat, held[i]), held[i + 1], held[i + 2])
              for i in range(0, len(held), 3)]

    return data.map_clients(client, (state.personal, keys), jnp.arange(data.num_clients),
                            algorithm.client_group, test=True, validation=validation)

  if algorithm.devices is None:
    results = tested(state, data, 0)
  else:
    results = sharded.tested(algorithm, tested, state, data)
  metrics = {}
  for (prefix, counts), (accuracies, hits) in zip(splits, results):
    metrics.update(accuracy_metrics(accuracies, hits, counts, prefix))
  return metrics


def new_clients(algorithm, adapted, data, key) -> dict:
  """`accuracy_metrics` of new clients (`data`: their own train and test sets), each tested
  with the params adapted(client_key, x, y, count) gives it (flat params adapted to its
  training data x [m, ...], y [m], count; new client i with the i-th of split(key, n))."""
  keys = jax.random.split(key, data.num_clients)

  def client(client_key, x, y, count, x_test, y_test, test_count):
    logits = algorithm.logits(adapted(client_key, x, y, count), x_test)
    return train.tested(logits, y_test, test_count)

  return accuracy_metrics(*data.map_clients(client, keys, jnp.arange(data.num_clients),
                                            algorithm.client_group, test=True),
                          data.test_counts)


def accuracy_metrics(accuracies: jax.Array, hits: jax.Array, test_counts: jax.Array,
                     prefix: str = "test_") -> dict:
  """The evaluation of n clients of accuracies [n] that got hits [n] (int) of their
  test_counts [n] test samples right (`train.tested`). A client without test samples (or
  whose test_counts are set to 0: not evaluated) is left out of every metric:

  test_accuracy: the mean over the tested clients (test_counts > 0) of their accuracies
    hits / test_counts; test_accuracy_weighted: sum(hits) / sum(test_counts) (the accuracy
    over all test samples); test_accuracy_std: the std (ddof 0) of the tested clients'
    accuracies; test_accuracy_p10: their 10th percentile (linear interpolation, as
    np.percentile: the worst decile's edge); test_clients: how many were tested (int32).
  The names start with `prefix` instead of "test_" where given (the validation split's:
  "val_", with its val_counts as test_counts). The accuracies are NaN where no client has
  test samples. With every client tested, the mean and std are jnp.mean and jnp.std of
  all: XLA sums masked values in another order, and this keeps the float32 values of the
  runs made before clients could be left out.
  """
  tested = test_counts > 0
  clients = jnp.sum(tested, dtype=jnp.int32)
  everyone = clients == accuracies.shape[0]
  mean = jnp.sum(jnp.where(tested, accuracies, 0.0)) / clients
  variance = jnp.sum(jnp.where(tested, jnp.square(accuracies - mean), 0.0)) / clients
  return {f"{prefix}accuracy": jnp.where(everyone, jnp.mean(accuracies), mean),
          f"{prefix}accuracy_weighted": (jnp.sum(jnp.where(tested, hits, 0))
                                         / jnp.sum(test_counts)),
          f"{prefix}accuracy_std": jnp.where(everyone, jnp.std(accuracies), jnp.sqrt(variance)),
          f"{prefix}accuracy_p10": jnp.nanpercentile(jnp.where(tested, accuracies, jnp.nan),
                                                     10),
          f"{prefix}clients": clients}


