"""The neural algorithms' evaluation: every client tested on its own test set, and the
metrics over the clients (`accuracy_metrics`)."""

import jax
import jax.numpy as jnp

from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import sharded
from fedjax_rep.nn import train


def evaluate(algorithm, state, data, hparams) -> dict:
  """Every client tested on its own test set with its own params (`eval_params`):
  `accuracy_metrics` over all clients, or with eval_clients="cohort" over the last round's
  cohort (those without test samples left out). Sharded, each device tests the clients it
  holds."""
  test_counts = (data.test_counts if state.cohort is None
                 else jnp.where(state.cohort, data.test_counts, 0))

  def tested(state, data, offset):  # `train.tested` [n'] of the clients offset + range(n')
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
        jax.random.wrap_key_data(state.eval_key), offset + jnp.arange(data.num_clients))

    def client(args, x, y, count, x_test, y_test, test_count):
      personal, key = args
      flat = algorithm.eval_params(state.shared, personal, x, y, count, key, hparams)
      return train.tested(algorithm.logits(flat, x_test), y_test, test_count)

    return data.map_clients(client, (state.personal, keys), jnp.arange(data.num_clients),
                            algorithm.client_group, test=True)

  if algorithm.devices is None:
    return accuracy_metrics(*tested(state, data, 0), test_counts)
  return accuracy_metrics(*sharded.tested(algorithm, tested, state, data), test_counts)


def new_clients(algorithm, body: dict, head: dict, data, hparams, key, epochs: int) -> dict:
  """`accuracy_metrics` of new clients (`data`: their own train and test sets) that keep
  `body` (flat 'body/...' params) and fit a head from `head` by `epochs` epochs of SGD on
  their training data (new client i with the i-th of split(key, n))."""
  keys = jax.random.split(key, data.num_clients)

  def client(client_key, x, y, count, x_test, y_test, test_count):
    new_head, _ = algorithm.train_head(body, head, x, y, count, client_key, hparams, epochs)
    logits = algorithm.logits(params_lib.merge(body, new_head), x_test)
    return train.tested(logits, y_test, test_count)

  return accuracy_metrics(*data.map_clients(client, keys, jnp.arange(data.num_clients),
                                            algorithm.client_group, test=True),
                          data.test_counts)


def accuracy_metrics(accuracies: jax.Array, hits: jax.Array, test_counts: jax.Array) -> dict:
  """The evaluation of n clients of accuracies [n] that got hits [n] (int) of their
  test_counts [n] test samples right (`train.tested`). A client without test samples (or
  whose test_counts are set to 0: not evaluated) is left out of every metric:

  test_accuracy: the mean over the tested clients (test_counts > 0) of their accuracies
    hits / test_counts; test_accuracy_weighted: sum(hits) / sum(test_counts) (the accuracy
    over all test samples); test_accuracy_std: the std (ddof 0) of the tested clients'
    accuracies; test_accuracy_p10: their 10th percentile (linear interpolation, as
    np.percentile: the worst decile's edge); test_clients: how many were tested (int32).
  The accuracies are NaN where no client has test samples. With every client tested, the
  mean and std are jnp.mean and jnp.std of all: XLA sums masked values in another order,
  and this keeps the float32 values of the runs made before clients could be left out.
  """
  tested = test_counts > 0
  clients = jnp.sum(tested, dtype=jnp.int32)
  everyone = clients == accuracies.shape[0]
  mean = jnp.sum(jnp.where(tested, accuracies, 0.0)) / clients
  variance = jnp.sum(jnp.where(tested, jnp.square(accuracies - mean), 0.0)) / clients
  return {"test_accuracy": jnp.where(everyone, jnp.mean(accuracies), mean),
          "test_accuracy_weighted": jnp.sum(jnp.where(tested, hits, 0)) / jnp.sum(test_counts),
          "test_accuracy_std": jnp.where(everyone, jnp.std(accuracies), jnp.sqrt(variance)),
          "test_accuracy_p10": jnp.nanpercentile(jnp.where(tested, accuracies, jnp.nan), 10),
          "test_clients": clients}


