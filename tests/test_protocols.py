"""The contracts of `core.protocols`: every registered algorithm, and every wrapper of one,
declares the attributes that the round loop reads."""

import dataclasses
from typing import ClassVar

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
    for wrapper in (Padded(inner), fr.Timed(inner, fr.fixed_speeds(6), cohort=3)):
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
