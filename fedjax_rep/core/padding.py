"""Runs with different numbers of clients in one compiled program: clients padded to a
common count, the real ones and the real cohort size traced.

A recipe comparing n in {10, 100, 1000} would otherwise compile one program per n. Padded
to 1000 clients (padding clients have all-zero data, so they add nothing to any sum), every
run samples its cohort of its own size among its own clients with `cohort.sample_padded`
(the same cohorts as the unpadded runs) and runs the algorithm's `masked_round` with the
padding masked out: the numbers are those of the unpadded runs up to float32 rounding.
"""

import dataclasses
from typing import Any

import jax
from jax.sharding import PartitionSpec

from fedjax_rep.core import checks
from fedjax_rep.core import cohort as cohort_lib
from fedjax_rep.core import struct
from fedjax_rep.core.protocols import Checked
from fedjax_rep.core.wrapper import Wrapper


@struct.dataclass
class PaddedData:
  """`data` padded to its `num_clients` (the common count) of which the first `active`
  (int32 []) are real; `cohort` (int32 []) is the real cohort size."""
  data: Any
  active: jax.Array
  cohort: jax.Array

  @property
  def num_clients(self) -> int:
    return self.data.num_clients


@dataclasses.dataclass(frozen=True)
class Padded(Wrapper):
  """`inner` (a `MaskedAlgorithm` whose `cohort` is the largest cohort of the padded runs)
  run on `PaddedData`: init on the padded data, rounds on each run's own cohort.

  The round key is split into (cohort key, batch key) as the inner algorithm's own round
  does, so that a padded run draws the same cohorts and batches as an unpadded one.
  """
  inner: Any

  @property
  def name(self) -> str:
    return self.inner.name

  def check(self, data: PaddedData, hparams) -> None:
    """The checks of a run, before anything compiles (`core.checks`): 1 <= cohort <= active
    <= num_clients, cohort at most the inner algorithm's, then the inner algorithm's checks
    of the unpadded run (its first `active` clients, its cohort) where these numbers are
    concrete, of the padded data otherwise."""
    inner, inner_data = self.inner, data.data
    if checks.concrete(data.active, data.cohort):
      active, cohort = int(data.active), int(data.cohort)
      checks.in_range("PaddedData.active", active, 1, data.num_clients,
                      "the padded number of clients", "pad to at least the active clients")
      checks.in_range("PaddedData.cohort", cohort, 1, min(active, self.inner.cohort),
                      "the active clients, at most the inner algorithm's cohort",
                      "give the inner algorithm the largest cohort of the padded runs")
      inner = dataclasses.replace(self.inner, cohort=cohort)
      inner_data = first_clients(data.data, active)
    if isinstance(inner, Checked):
      inner.check(inner_data, hparams)

  def init(self, key, data: PaddedData, hparams):
    return self.inner.init(key, data.data, hparams)

  def round(self, state, key, data: PaddedData, hparams):
    key_cohort, key_data = jax.random.split(key)
    clients, mask = cohort_lib.sample_padded(key_cohort, data.num_clients, self.inner.cohort,
                                             data.active, data.cohort)
    return self.inner.masked_round(state, key_data, data.data, hparams, clients, mask)


def first_clients(data, n: int):
  """`data` (`core.protocols.LinearData`) restricted to its first n clients: every leaf
  that the data's `client_specs` marks as per-client cut to n rows."""
  mark = PartitionSpec("clients")
  marks = data.client_specs(mark)
  return jax.tree.map(lambda leaf, spec: leaf[:n] if spec == mark else leaf, data, marks)
