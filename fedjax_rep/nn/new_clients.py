"""Clients that never train, tested at every evaluation after adapting to their own data.

`WithNewClients` holds a run's training clients and its new clients (`data.new_clients.split`
holds them out); `NewClients` runs an algorithm on the training clients only and adds to each
evaluation the new clients' metrics: every new client adapts what the algorithm personalises
on its own training split for `epochs` epochs (the algorithm's `new_clients`, a hook a plugin
may override) and is tested on its test split. The metrics are `evaluation.accuracy_metrics`
named new_accuracy, new_accuracy_weighted, new_accuracy_std, new_accuracy_p10 and
new_client_count.
"""

import dataclasses
from typing import Any

import jax

from fedjax_rep.core import struct
from fedjax_rep.core.protocols import Checked
from fedjax_rep.core.wrapper import Wrapper

PREFIX = "new_"
COUNT = "new_client_count"  # test_clients' companion (new_clients is the configuration key)


@struct.dataclass
class WithNewClients:
  """The training clients `train` and the new clients `new` of the same runs (each a
  `core.protocols.ClassificationData`, stacked alike). What the recipes ask of the data
  (its clients, classes, inputs, validation split) is the training clients'."""
  train: Any
  new: Any

  @property
  def num_clients(self) -> int:
    return self.train.num_clients

  @property
  def num_classes(self) -> int:
    return self.train.num_classes

  @property
  def has_validation(self) -> bool:
    return self.train.has_validation

  def input_spec(self, runs: int = 0) -> jax.ShapeDtypeStruct:
    return self.train.input_spec(runs)


def renamed(metrics: dict) -> dict:
  """`accuracy_metrics` of the new clients (test_accuracy, ..., test_clients) under their
  new_* names (`PREFIX`; test_clients: `COUNT`)."""
  name = lambda k: COUNT if k == "test_clients" else PREFIX + k[len("test_"):]
  return {name(k): v for k, v in metrics.items()}


@dataclasses.dataclass(frozen=True)
class NewClients(Wrapper):
  """`inner` (a neural algorithm) trained on `WithNewClients.train`; each evaluation also
  tests the new clients after `epochs` epochs of adaptation (`inner.new_clients`, the
  adaptation key drawn from the state's evaluation key)."""
  inner: Any
  epochs: int

  @property
  def name(self) -> str:
    return self.inner.name

  def check(self, data: WithNewClients, hparams) -> None:
    """The inner algorithm's checks of the training clients, and the new clients' data
    checked for the training clients' classes."""
    if isinstance(self.inner, Checked):
      self.inner.check(data.train, hparams)
    data.new.check(data.train.num_classes)

  def init(self, key, data: WithNewClients, hparams):
    return self.inner.init(key, data.train, hparams)

  def round(self, state, key, data: WithNewClients, hparams):
    return self.inner.round(state, key, data.train, hparams)

  def masked_round(self, state, key, data: WithNewClients, hparams, clients, mask):
    return self.inner.masked_round(state, key, data.train, hparams, clients, mask)

  def evaluate(self, state, data: WithNewClients, hparams) -> dict:
    """The inner algorithm's evaluation of the training clients, and the new clients'
    (`renamed`) after `epochs` epochs of adaptation."""
    key = jax.random.fold_in(jax.random.wrap_key_data(state.eval_key), 1)
    new = self.inner.new_clients(state, data.new, hparams, key, self.epochs)
    return {**self.inner.evaluate(state, data.train, hparams), **renamed(new)}
