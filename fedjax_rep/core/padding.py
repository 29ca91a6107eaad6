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
from flax import struct

from fedjax_rep.core import cohort as cohort_lib


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
class Padded:
  """`inner` (a `MaskedAlgorithm` whose `cohort` is the largest cohort of the padded runs)
  run on `PaddedData`: init on the padded data, rounds on each run's own cohort.

  The round key is split into (cohort key, batch key) as the inner algorithm's own round
  does, so that a padded run draws the same cohorts and batches as an unpadded one.
  """
  inner: Any

  @property
  def name(self) -> str:
    return self.inner.name

  def init(self, key, data: PaddedData, hparams):
    return self.inner.init(key, data.data, hparams)

  def round(self, state, key, data: PaddedData, hparams):
    key_cohort, key_data = jax.random.split(key)
    clients, mask = cohort_lib.sample_padded(key_cohort, data.num_clients, self.inner.cohort,
                                             data.active, data.cohort)
    return self.inner.masked_round(state, key_data, data.data, hparams, clients, mask)
