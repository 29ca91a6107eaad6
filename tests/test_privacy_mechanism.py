"""User-level DP of the shared parameters (nn/privacy.py): every clipped update within
dp_clip, the noise of the stated std, the non-private algorithm (uniform weights) where the
clip binds nothing and there is no noise, personal parameters never noised, and the
algorithms whose server sees other client data refused before any work."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedjax_rep.core import cohort as cohort_lib
from fedjax_rep.core import loop
from fedjax_rep.data import digits, federated
from fedjax_rep.nn import algorithms as nn_algorithms
from fedjax_rep.nn import hparams as hparams_lib
from fedjax_rep.nn import models
from fedjax_rep.nn import privacy as mechanism


def cohort_updates(c=6, seed=0):
  rng = np.random.default_rng(seed)
  reference = {"body/w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
               "head/b": jnp.asarray(rng.normal(size=(5,)), jnp.float32)}
  scales = lambda v: rng.uniform(0.1, 3, (c,) + (1,) * v.ndim)
  sent = {p: v[None] + jnp.asarray(rng.normal(size=(c, *v.shape)) * scales(v), jnp.float32)
          for p, v in reference.items()}
  return reference, sent


def test_every_clipped_update_is_within_the_clip_and_a_small_one_is_kept():
  reference, sent = cohort_updates()
  weights = jnp.array([1.0, 1, 1, 0, 1, 1])
  updates, norms = mechanism.clipped_updates(reference, sent, weights, None, 2.0)
  clipped = np.sqrt(sum(np.sum(np.reshape(u, (6, -1)) ** 2, axis=1)
                        for u in updates.values()))
  assert np.all(clipped <= 2.0 * (1 + 1e-6)) and clipped[3] == 0.0
  raw = np.sqrt(sum(np.sum(np.reshape(sent[p] - reference[p][None], (6, -1)) ** 2, axis=1)
                    for p in sent))
  np.testing.assert_allclose(norms, raw, rtol=1e-6)
  small = (raw <= 2.0) & (np.asarray(weights) > 0)
  np.testing.assert_allclose(clipped[small], raw[small], rtol=1e-6)
  np.testing.assert_allclose(clipped[~small & (np.asarray(weights) > 0)], 2.0, rtol=1e-6)


def test_the_noise_on_the_average_has_std_noise_times_clip_over_the_cohort():
  reference = {"w": jnp.zeros((200_000,))}
  sent = {"w": jnp.zeros((8, 200_000))}
  hparams = hparams_lib.hparams(0.1, 0.0, 0.0, dp_clip=0.5, dp_noise=1.3)
  mean, _ = mechanism.private_mean(reference, sent, jnp.ones(8), None, hparams, 8,
                                   jax.random.key(0))
  std = float(np.std(np.asarray(mean["w"])))
  assert abs(std / (1.3 * 0.5 / 8) - 1) < 0.02


def test_leaves_a_client_does_not_share_get_no_noise_and_no_update():
  reference, sent = cohort_updates()
  hparams = hparams_lib.hparams(0.1, 0.0, 0.0, dp_clip=1.0, dp_noise=2.0)
  shared = {"body/w": jnp.asarray(True), "head/b": jnp.asarray(False)}
  mean, metrics = mechanism.private_mean(reference, sent, jnp.ones(6), shared, hparams, 6,
                                         jax.random.key(1))
  np.testing.assert_array_equal(mean["head/b"], reference["head/b"])
  assert not np.allclose(mean["body/w"], reference["body/w"])
  assert 0 <= float(metrics["dp_clipped"]) <= 1


def small_run(name, options, rounds=3):
  data = federated.stack([digits.federated(10, "classes", 2, seed=s) for s in (0, 1)])
  model = models.make_model("digits-mlp", digits.NUM_CLASSES)
  algorithm = nn_algorithms.make_algorithm(name, model=model, cohort=4, local_epochs=1,
                                           head_epochs=2, batch_size=10, client_group=4)
  hparams = hparams_lib.hparams(0.05, 0.5, 1e-4, **options)
  keys = jax.random.split(jax.random.key(3), 2)
  return loop.run(algorithm, data, hparams, keys, rounds, sweep_axes=(0, None, 0),
                  progress=False)


@pytest.mark.parametrize("name", ["fedavg", "fedrep"])
def test_no_noise_and_a_clip_that_binds_nothing_is_the_uniform_average(name):
  plain = small_run(name, {"uniform_average": 1.0})
  private = small_run(name, {"uniform_average": 1.0, "dp_clip": 1e6, "dp_noise": 0.0})
  np.testing.assert_allclose(private.metrics["train_loss"], plain.metrics["train_loss"],
                             rtol=2e-5, atol=1e-6)
  for a, b in zip(jax.tree.leaves(private.state.shared), jax.tree.leaves(plain.state.shared)):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
  np.testing.assert_array_equal(private.metrics["dp_clipped"], 0.0)
  noisy = small_run(name, {"uniform_average": 1.0, "dp_clip": 0.1, "dp_noise": 1.0})
  assert np.all(noisy.metrics["dp_clipped"] > 0)


@pytest.mark.parametrize("name", ["scaffold", "flute", "fed-mtl", "l2gd"])
def test_an_algorithm_whose_server_sees_other_client_data_is_refused(name):
  with pytest.raises(ValueError, match="cannot run under user-level DP"):
    small_run(name, {"dp_clip": 1.0, "dp_noise": 1.0}, rounds=1)


def test_fedbabu_averages_its_bodies_and_runs_privately():
  assert mechanism.refusal(nn_algorithms.CLASSES["fedbabu"]) is None
  assert dataclasses.is_dataclass(nn_algorithms.CLASSES["fedbabu"])


def test_poisson_sampling_trains_a_uniform_subset_of_a_truncated_binomial_size():
  n, c, draws = 50, 10, 20_000
  hparams = hparams_lib.hparams(0.1, 0.0, 0.0, dp_clip=1.0, dp_poisson=1.0)

  def draw(key):  # as Algorithm.round draws a round's clients and who of them trains
    clients = cohort_lib.sample_cohort(key, n, c)
    return clients, mechanism.poisson_mask(jax.random.fold_in(key, 1), n, c, hparams)

  clients, masks = jax.jit(jax.vmap(draw))(jax.random.split(jax.random.key(0), draws))
  trained = np.asarray(masks).sum(axis=1)
  k = np.arange(n + 1)
  exact = stats.binom.pmf(k, n, c / n)
  expected = np.minimum(k, c) @ exact
  assert abs(trained.mean() / expected - 1) < 0.01
  assert abs(np.mean(trained == c) / exact[c:].sum() - 1) < 0.03  # truncated rounds
  assert np.all(np.asarray(masks)[np.arange(draws), np.maximum(trained - 1, 0)] | (trained == 0))
  joined = np.bincount(np.asarray(clients)[np.asarray(masks)], minlength=n) / draws
  spread = np.sqrt(expected / n * (1 - expected / n) / draws)
  assert np.max(np.abs(joined - expected / n)) < 5 * spread  # every client alike
  assert mechanism.poisson_mask(jax.random.key(0), n, c, hparams_lib.hparams(
      0.1, 0.0, 0.0, dp_clip=1.0)) is None
  off = mechanism.poisson_mask(jax.random.key(0), n, c, hparams_lib.hparams(
      0.1, 0.0, 0.0, dp_clip=1.0, dp_poisson=0.0))
  assert np.all(np.asarray(off))


def test_a_poisson_round_trains_only_the_clients_that_joined():
  poisson = small_run("fedrep", {"dp_clip": 1.0, "dp_noise": 0.5, "dp_poisson": 1.0},
                      rounds=6)
  fixed = small_run("fedrep", {"dp_clip": 1.0, "dp_noise": 0.5}, rounds=6)
  assert np.all(np.isfinite(poisson.metrics["train_loss"]))
  assert not np.allclose(poisson.metrics["train_loss"], fixed.metrics["train_loss"])
  again = small_run("fedrep", {"dp_clip": 1.0, "dp_noise": 0.5, "dp_poisson": 1.0}, rounds=6)
  np.testing.assert_array_equal(poisson.metrics["train_loss"], again.metrics["train_loss"])


@pytest.mark.parametrize("placement, words", [
    ({"cohort": 10}, "needs a cohort below the 10 clients"),
    ({"cohort_groups": 2}, "stratified over 2 groups")])
def test_poisson_at_full_participation_and_a_stratified_cohort_are_refused(placement, words):
  data = digits.federated(10, "classes", 2, seed=0)
  model = models.make_model("digits-mlp", digits.NUM_CLASSES)
  algorithm = nn_algorithms.make_algorithm(
      "fedrep", model=model, local_epochs=1, head_epochs=1, batch_size=10,
      **{"cohort": 4, **placement})
  hparams = hparams_lib.hparams(0.05, 0.5, 1e-4, dp_clip=1.0, dp_poisson=1.0)
  with pytest.raises(ValueError, match=words):
    algorithm.check(data, hparams)
