"""The contracts of `core.protocols`: every registered algorithm, and every wrapper of one,
declares the attributes that the round loop reads."""

import dataclasses
from typing import ClassVar

import jax
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.core import registry
from fedjax_rep.core.padding import Padded
from fedjax_rep.core.protocols import Algorithm


def make(family: str, name: str):
  """The algorithm registered as `name` in `family`, with a small structure."""
  if family == "linear":
    return fr.make_algorithm(name, rep_dim=2, cohort=3)
  return fr.make_neural_algorithm(name, model=fr.make_model("digits-mlp", 10), cohort=3)


def test_every_registered_algorithm_declares_quick_compile_and_tracked_metric():
  assert fr.ALGORITHMS is registry.ALGORITHMS  # the flat API registers both families
  for family, entries in registry.ALGORITHMS.items():
    for name in entries:
      algorithm = make(family, name)
      assert isinstance(algorithm, Algorithm), (family, name)
      assert algorithm.quick_compile is (family == "neural"), (family, name)
      expected = "model_error" if (family, name) == ("linear", "flute") else None
      assert algorithm.tracked_metric == expected, (family, name)


def test_the_wrappers_forward_the_inner_algorithms_attributes():
  for inner in (make("linear", "fedrep"), make("neural", "fedrep")):
    for wrapper in (Padded(inner), fr.Timed(inner, fr.fixed_speeds(6), cohort=3),
                    fr.NewClients(inner, epochs=2)):
      assert isinstance(wrapper, Algorithm)
      assert wrapper.quick_compile is inner.quick_compile
      assert wrapper.tracked_metric is inner.tracked_metric


@dataclasses.dataclass(frozen=True)
class Untracked:
  """An algorithm but for `tracked_metric`."""
  name: str = "untracked"
  quick_compile: ClassVar[bool] = False

  def init(self, key, data, hparams):
    return None

  def round(self, state, key, data, hparams):
    return state, {}


@dataclasses.dataclass(frozen=True)
class Tracked(Untracked):
  tracked_metric: ClassVar[str | None] = None


def test_an_object_without_tracked_metric_is_not_an_algorithm():
  assert not isinstance(Untracked(), Algorithm)
  assert isinstance(Tracked(), Algorithm)


def test_the_neural_data_say_what_they_hold():
  """ClientDatasets and FlatClients are ClassificationData (classes, a validation split,
  specs: asked, never probed); the linear data are not, and a neural run refuses them."""
  from fedjax_rep.core.protocols import ClassificationData
  from fedjax_rep.data import flat
  data = fr.digits.federated(6, "classes", 2, seed=0)
  split = fr.validation_split(data, 0.2, 0)
  for each in (data, split, flat.from_padded(data), flat.from_padded(split)):
    assert isinstance(each, ClassificationData)
    assert each.num_classes == 10 and each.has_validation == (each.val_counts is not None)
  linear = fr.client_data(np.ones((3, 4, 2), np.float32), np.ones((3, 4), np.float32))
  assert not isinstance(linear, ClassificationData)
  fedrep = make("neural", "fedrep")
  with pytest.raises(ValueError, match="the neural algorithms train on classification data"):
    fedrep.check(linear, fr.nn_hparams(lr=0.1))


def test_the_linear_data_say_what_they_hold():
  """Every linear data mode is LinearData (checks itself, says its per-client leaves: asked,
  never probed), and a padded run's first clients are cut from those leaves only."""
  from fedjax_rep.core.padding import first_clients
  from fedjax_rep.core.protocols import LinearData
  problem = fr.make_problem(jax.random.key(0), num_clients=6, dim=5, rep_dim=2, noise_std=0.1)
  fixed = fr.client_data(np.ones((6, 4, 5), np.float32), np.ones((6, 4), np.float32))
  fresh, population = fr.FreshData(problem, samples=3), fr.PopulationData(problem)
  for each in (fixed, fresh, population):
    assert isinstance(each, LinearData)
    each.check(2)
  for each in (fresh, population):
    cut = first_clients(each, 4)
    assert cut.problem.W_star.shape == (4, 2) and cut.problem.B_star.shape == (5, 2)
  assert first_clients(fixed, 4).X.shape == (4, 4, 5)
  assert not isinstance(fr.digits.federated(6, "classes", 2, seed=0), LinearData)
