"""FedRep on linear models: exact heads (Algorithm 2), GD-GD and tau GD-GD.

Each round a cohort of clients each computes its head on its batch with B frozen: the exact
least-squares head (`head_steps=None`, FedRep) or `head_steps` gradient steps from its
previous head (tau GD-GD); then one gradient step on B of (1/2m_i)||X_i B w_i - y_i||^2. The
server averages the clients' B_i = B - lr * g_i. Heads persist; clients not sampled keep theirs.

A round runs its clients in blocks (`blocks.map_blocks`: a scan over cache-sized blocks
adding up the aggregation's weighted sums), so each client's data is read or generated
once and memory is O(block); with `devices` > 1 the clients are split over devices
(`core.sharding.over_clients`: each device scans its own blocks, one psum). Fresh data with
sampler="statistics" run the clients in the 2k-dimensional basis of span[B, B*]
(`fresh_statistics`). With full participation and exact heads, on fixed data or fresh data
of the statistics sampler, the round can run as one C++ kernel instead, when asked for
(`FedRep(kernel="native")`, `fedjax_rep.native.fedrep_round`).
"""

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp

from fedjax_rep.core import aggregate
from fedjax_rep.core import checks
from fedjax_rep.core import cohort as cohort_lib
from fedjax_rep.core import sharding
from fedjax_rep.core import struct
from fedjax_rep.core import tree
from fedjax_rep.linear import blocks
from fedjax_rep.linear import features
from fedjax_rep.linear import fresh_statistics
from fedjax_rep.linear import heads as heads_lib
from fedjax_rep.linear import init as init_lib
from fedjax_rep.linear.data_modes import FixedData, FreshData
from fedjax_rep.linear.hparams import LinearHparams
from fedjax_rep.linear.metrics import round_metrics
from fedjax_rep.linear.checks import check_data

TRACED_HEAD_STEPS = "traced"  # FedRep.head_steps: read the number from hparams.head_steps
KERNELS = ("xla", "native")  # FedRep.kernel


@struct.dataclass
class RepState:
  """Shared representation B [d, k] and personal heads [n, k]."""
  B: jax.Array
  heads: jax.Array


def mean_rep_gradient(X: jax.Array, residual: jax.Array, w: jax.Array,
                      counts: jax.Array | None = None, mask: jax.Array | None = None):
  """The mean over clients of the gradient in B of (1/2m_i)||X_i B w_i - y_i||^2.

  That is (1/c) sum_i (1/m_i) X_i^T r_i w_i^T, computed as one contraction over (client,
  sample) (`aggregate.weighted_einsum`), instead of c small products.

  Args:
    X: the clients' samples [c, m, d] (padding rows zero).
    residual: r = X B w - y [c, m].
    w: the clients' heads [c, k].
    counts: m_i, the real samples of each client [c]; None: m for all.
    mask: [c] (bool): the mean is over the clients where it is True (c = their number);
      None: all.

  Returns:
    The mean gradient [d, k].
  """
  c, m = residual.shape
  counts = jnp.full((c,), m, residual.dtype) if counts is None else counts
  weights = jnp.ones((c,), residual.dtype) if mask is None else mask.astype(residual.dtype)
  return aggregate.mean(*aggregate.weighted_einsum(
      "cmd,cm,ck->dk", weights, X, residual / counts[:, None], w))


@dataclasses.dataclass(frozen=True)
class FedRep:
  """FedRep family. Structure (static): rep_dim k, cohort size, head_steps, init, QR, and
  how the client axis runs (block, devices, client_groups).

  head_steps: None for exact least-squares heads (FedRep), an int for that many head GD
  steps (GD-GD, tau GD-GD), or TRACED_HEAD_STEPS to take it from hparams.head_steps (0:
  exact), so that runs of all three share one program.
  block: clients per block (None: sized to the CPU cache, `blocks.block_size`); results do
  not depend on it beyond float32 round-off.
  devices: split the clients over this many devices (None or 1: one device); the number
  of clients must be a multiple of it.
  client_groups: with partial participation, sample the cohort stratified over this many
  contiguous groups of clients (`cohort.sample_grouped`), each device drawing its own
  groups (a multiple of devices; default: devices when devices > 1, else the plain
  uniform cohort). Fixing it makes 1 and D devices give the same cohorts.
  kernel: "xla" (the default: every round in blocks of XLA ops; never builds anything) or
  "native" (opt-in: every round as the C++ kernel `fixed_round` / `fresh_round` of
  `fedjax_rep.native.fedrep_round`, built with the machine's compiler on first use).
  "native" runs only rounds with full participation (`round`, not `masked_round`) and exact
  heads, on fixed data or fresh data of the statistics sampler, float32 on the CPU, rep_dim
  <= 8; elsewhere, or where the kernel does not build, a one-line ValueError before any
  work. The two agree up to float32 round-off, not bit for bit.
  """
  rep_dim: int
  cohort: int
  head_steps: int | None = None
  init_method: str = "moments"
  orthonormalize: bool = False
  name: str = "fedrep"
  block: int | None = None
  devices: int | None = None
  client_groups: int | None = None
  kernel: str = "xla"
  # `core.protocols.Algorithm`: XLA's default compiler options; the blow-up bound watches
  # train_loss.
  quick_compile: ClassVar[bool] = False
  tracked_metric: ClassVar[str | None] = None

  def __post_init__(self):
    checks.positive_ints("FedRep", rep_dim=self.rep_dim, cohort=self.cohort)
    blocks.block_size(1, 1, self.block)  # validates block
    sharding.check_devices(self.devices)
    if self.kernel not in KERNELS:
      raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {self.kernel!r}")
    groups = self.groups
    if groups is not None and (isinstance(groups, bool) or not isinstance(groups, int)
                               or groups < 1 or groups % (self.devices or 1)):
      raise ValueError(f"client_groups must be a positive multiple of devices="
                       f"{self.devices or 1}, got {self.client_groups!r}")

  @property
  def groups(self) -> int | None:
    """The cohort's client groups: client_groups, else devices when devices > 1."""
    if self.client_groups is not None:
      return self.client_groups
    return self.devices if (self.devices or 1) > 1 else None

  def check(self, data, hparams: LinearHparams) -> None:
    """The checks of a run, before anything compiles (`validation.check_data`)."""
    del hparams
    check_data(data, self.rep_dim, self.cohort)
    if self.kernel == "native":
      self._runs_native(data, self.cohort == data.num_clients)

  @staticmethod
  def _native():
    """The C++ kernels' module. Imported here, only for kernel="native", not at the top:
    the default path never imports the kernels' build, let alone runs a compiler."""
    from fedjax_rep.native import fedrep_round  # pylint: disable=import-outside-toplevel
    return fedrep_round

  def _native_obstacle(self, data, full_participation: bool, key) -> str | None:
    """Why a round on `data` drawn with `key` cannot run the C++ kernel, or None once the
    kernel is built and loaded."""
    kernels = self._native()
    if self.head_steps is not None:
      return f"it computes exact heads only (head_steps=None, got {self.head_steps!r})"
    if isinstance(data, FixedData):
      name, dtype = kernels.FIXED, data.X.dtype
    elif isinstance(data, FreshData) and data.sampler == "statistics":
      name, dtype = kernels.FRESH, data.problem.W_star.dtype
    else:
      sampler = f"(sampler={data.sampler!r})" if isinstance(data, FreshData) else ""
      return (f"it runs on FixedData or FreshData(sampler='statistics') only (got "
              f"{type(data).__name__}{sampler})")
    if not full_participation:
      return f"it runs full participation only (cohort {self.cohort} < the number of clients)"
    obstacle = kernels.unsupported(dtype, data.samples, self.rep_dim)
    if obstacle is None and name == kernels.FRESH:
      obstacle = kernels.unsupported_key(key)
    if obstacle is None:
      try:
        kernels.load(name)
      except kernels.build.NativeUnavailable as error:
        return str(error)
    return obstacle

  def _runs_native(self, data, full_participation: bool, key=None) -> bool:
    """Whether a round on `data` (drawn with `key`; None: a key of the default
    implementation) runs the C++ kernel: never with kernel="xla"; always with
    kernel="native", which builds and loads it here, or a ValueError saying why it cannot."""
    if self.kernel == "xla":
      return False
    key = jax.random.key(0) if key is None else key
    obstacle = self._native_obstacle(data, full_participation, key)
    if obstacle is not None:
      raise ValueError(f"FedRep(kernel='native') cannot run this round: {obstacle}; use "
                       f"kernel='xla'")
    return True

  def init(self, key, data, hparams: LinearHparams) -> RepState:
    """B0 by `init_method`; heads start at zero."""
    del hparams
    B = init_lib.init_representation(key, data, self.rep_dim, self.init_method,
                                     block=self.block, devices=self.devices)
    heads = jnp.zeros((data.num_clients, self.rep_dim), B.dtype)
    return RepState(B=B, heads=sharding.constrain_clients(heads, self.devices))

  def client_heads(self, Z, y, previous, hparams):
    """Heads [c, k] of clients with features Z = X B [c, m, k], labels y [c, m]."""
    if self.head_steps is None:
      return heads_lib.least_squares(Z, y)
    steps = hparams.head_steps if self.head_steps == TRACED_HEAD_STEPS else self.head_steps
    gd = jax.vmap(heads_lib.head_gd, in_axes=(0, 0, 0, None, None))(
        Z, y, previous, hparams.head_lr, steps)
    if self.head_steps != TRACED_HEAD_STEPS:
      return gd
    return jnp.where(steps == 0, heads_lib.least_squares(Z, y), gd)

  def round(self, state: RepState, key, data, hparams: LinearHparams):
    key_cohort, key_data = jax.random.split(key)
    n = data.num_clients
    if self.cohort == n:
      return self._round(state, key_data, data, hparams, "all")
    if self.groups is not None:
      return self._round(state, key_data, data, hparams, "grouped", key_cohort)
    clients = cohort_lib.sample_cohort(key_cohort, n, self.cohort)
    return self.masked_round(state, key_data, data, hparams, clients)

  def masked_round(self, state: RepState, key, data, hparams: LinearHparams, clients,
                   mask=None):
    """One round of the clients `clients` [c] where `mask` [c] (bool; default all) is True:
    only they update their heads and enter the server's average (static shapes: the
    cohort keeps its size c whatever the mask). `key` draws the batches. One device only."""
    if (self.devices or 1) > 1:
      raise ValueError(f"masked_round runs on one device; FedRep(devices={self.devices}) "
                       f"samples its cohort per device in `round`")
    if self.kernel == "native":
      raise ValueError("FedRep(kernel='native') runs full-participation rounds only, not "
                       "masked_round (a given or padded cohort); use kernel='xla'")
    return self._round(state, key, data, hparams, "given", (clients, mask))

  def _round(self, state: RepState, key, data, hparams, mode: str, cohort=None):
    """The round with clients chosen by `mode`: "all" (full participation, contiguous
    blocks), "grouped" (cohort = `cohort_lib.sample_grouped` with key `cohort`) or "given"
    (cohort = (clients [c], mask [c] or None))."""
    basis = data.basis(state.B)
    key_outside = None
    if basis is not None:
      key, key_outside = jax.random.split(key)
    coords = state.B if basis is None else basis.T @ state.B
    sums, heads = sharding.over_clients(
        functools.partial(self._clients, mode=mode), self.devices, data.num_clients,
        (data, state.heads), lambda spec: (data.client_specs(spec), spec),
        (key, basis, coords, hparams, cohort))
    gradient = sums["gradient"].T
    if basis is not None:
      gradient = basis @ gradient + fresh_statistics.outside_gradient(
          key_outside, basis, sums["outside"])
    B = state.B - hparams.lr * aggregate.mean(gradient, sums["weight"])
    if self.orthonormalize:
      B = jnp.linalg.qr(B)[0]
    state = RepState(B=B, heads=heads)
    train_loss = aggregate.mean(sums["loss"], sums["weight"])
    return state, round_metrics(B, lambda: self.personal_models(state, data), data, train_loss)

  def _clients(self, index, client_args, shared, *, mode):
    """(sums, new heads [n_local, k]) of one device's clients (index: its mesh position):
    sums["gradient"] [k, p] = sum_i mask_i (1/m_i) w_i r_i^T V_i in the round's basis (the
    transposed gradient), "loss" = sum_i mask_i (1/2m_i)||r_i||^2, "weight" = sum_i mask_i,
    and with a basis "outside" (`fresh_statistics.residual_statistic`).

    A block of c clients works on its samples as rows [c m, p] and on Z^T [k, c, m]
    (`features.k_major`; its row-major product for fixed data): both products with the
    samples, Z^T and the gradient (w r^T) V, work on the same rows, so the block's samples
    are read (sliced or drawn) once for both.
    """
    data, heads = client_args
    key, basis, coords, hparams, cohort = shared
    n = data.num_clients
    offset = index * n
    k = coords.shape[1]
    read = isinstance(data, FixedData)  # read from memory, not generated
    if mode == "all" and self._runs_native(data, True, key):
      if read:
        counts = (jnp.full((n,), data.samples, jnp.float32) if data.counts is None
                  else data.counts.astype(jnp.float32))
        w, gradient, loss = self._native().fixed_round(data.X, data.y, counts, coords)
        return {"gradient": gradient, "loss": loss, "weight": jnp.full_like(loss, n)}, w
      problem = data.problem
      w, gradient, loss, outside = self._native().fresh_round(
          key, offset, problem.W_star, basis.T @ problem.B_star, coords, problem.noise_std,
          data.samples)
      return {"gradient": gradient, "loss": loss, "weight": jnp.full_like(loss, n),
              "outside": outside}, w

    def one_block(clients, previous, mask, contiguous):
      V, y = data.design(key, clients, basis, offset=offset, contiguous=contiguous)
      c, m, p = V.shape
      rows = V.reshape(c * m, p)
      counts = data.sample_counts(clients)
      Zt = features.k_major(V, coords, row_major=read)
      w = self.client_heads(jnp.moveaxis(Zt, 0, -1), y, previous, hparams)
      weights = jnp.ones(clients.shape, Zt.dtype) if mask is None else mask.astype(Zt.dtype)
      if mask is not None:
        w = jnp.where(mask[:, None], w, previous)
      residual = features.apply_heads(Zt, w) - y  # [c, m]
      scaled = residual / counts[:, None]
      weighted = (weights[:, None] * w).T[:, :, None] * scaled  # [k, c, m]
      losses = 0.5 * jnp.sum(residual * scaled, axis=1)
      sums = {"gradient": weighted.reshape(k, c * m) @ rows,
              "loss": jnp.sum(weights * losses), "weight": jnp.sum(weights)}
      if basis is not None:
        sums["outside"] = fresh_statistics.residual_statistic(weights, scaled, w)
      return sums, w

    client_bytes = 4 * data.samples * (coords.shape[0] + 1)  # one client's V and y
    if mode == "all":
      def full(start, size, parts):
        return one_block(start + jnp.arange(size), parts[0], None, True)

      return blocks.map_blocks(full, n, blocks.block_size(n, client_bytes, self.block, read),
                             (heads,))
    if mode == "grouped":
      local_groups = self.groups // (self.devices or 1)
      group_ids = index * local_groups + jnp.arange(local_groups)
      clients = cohort_lib.sample_grouped(cohort, n * (self.devices or 1), self.cohort,
                                          self.groups, group_ids) - offset
      mask = None
    else:
      clients, mask = cohort
    mask_or_all = jnp.ones(clients.shape, bool) if mask is None else mask

    def gathered(start, size, parts):
      del start
      ids, previous, block_mask = parts
      return one_block(ids, previous, None if mask is None else block_mask, False)

    size = blocks.block_size(clients.shape[0], client_bytes, self.block, read)
    sums, w = blocks.map_blocks(gathered, clients.shape[0], size,
                                (clients, tree.gather(heads, clients), mask_or_all))
    return sums, tree.scatter(heads, clients, w)

  def personal_models(self, state: RepState, data) -> jax.Array:
    """theta_i = B w_i [n, d]. With fixed local data each client refits its head on its own
    data for the current B (least squares); otherwise its stored head is used."""
    fitted = data.refit_models(state.B)
    return state.heads @ state.B.T if fitted is None else fitted
