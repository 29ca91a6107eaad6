"""The contracts between the round loop, the algorithms and their client data.

An algorithm is a hashable object (a frozen dataclass: its fields are structure, static
in the compiled program) with pure methods; `hparams` are traced numbers, so a sweep over
them is a `vmap`. Data are pytrees that carry their own behaviour (what a batch is, how
many samples a client has, what can be measured on them), so algorithms never ask which
kind of data they were given.
"""

from typing import Any, Protocol, runtime_checkable

import jax

Metrics = dict[str, jax.Array]


@runtime_checkable
class ClientData(Protocol):
  """Per-client data with a leading client axis."""

  @property
  def num_clients(self) -> int:
    """n: the number of clients."""

  def sample_counts(self, clients: jax.Array) -> jax.Array:
    """Real samples [c] (float32) of clients `clients` [c] (their aggregation weights)."""

  def batch(self, key: jax.Array, clients: jax.Array) -> Any:
    """What clients `clients` [c] train on this round (leading axis c); `key` draws it
    where the data are sampled afresh."""


@runtime_checkable
class LinearData(ClientData, Protocol):
  """The linear algorithms' data (`linear.data_modes`): client data that check themselves
  and say which of their leaves are per-client."""

  def check(self, rep_dim: int, heads: bool = True) -> None:
    """Raises ValueError on data a linear algorithm with rep_dim k cannot run on (warns
    where `heads`, the clients fitting heads, meets fewer samples than k)."""

  def client_specs(self, spec: Any) -> Any:
    """The data's pytree with `spec` (a `PartitionSpec`) at its per-client leaves and
    `PartitionSpec()` (replicated) at the others."""


@runtime_checkable
class ClassificationData(Protocol):
  """Per-client classification data with a leading client axis (the neural algorithms':
  `data.federated.ClientDatasets`, `data.flat.FlatClients`), which say what they hold: the
  code asks these, never probes. The clients train through `map_clients`."""
  num_classes: int
  """C: every label is in [0, C)."""

  @property
  def num_clients(self) -> int:
    """n: the number of clients."""

  def sample_counts(self, clients: jax.Array) -> jax.Array:
    """Real training samples [c] (float32) of clients `clients` [c]."""

  @property
  def has_validation(self) -> bool:
    """Whether every client holds a validation split beside its test split
    (`data.validation.split`)."""

  def input_spec(self, runs: int = 0) -> jax.ShapeDtypeStruct:
    """The shape and dtype of one input (x after its `runs` leading run axes)."""

  def client_spec(self) -> tuple:
    """Shapes and dtypes of one client's training data: (x [m, ...], y [m], count [])."""

  def check(self, classes: int | None = None) -> None:
    """Raises ValueError on data no algorithm can train on, labels outside [0, classes)
    (default num_classes) among them."""

  def map_clients(self, fn, per_client, clients: jax.Array, group: int | None,
                  test: bool = False, validation: bool = False):
    """fn(args, x, y, count[, x_test, y_test, test_count][, x_val, y_val, val_count]) for
    each of the clients `clients` [c] with its leaves of `per_client`, in groups of
    `group`: fn's outputs, leaves [c, ...]."""


@runtime_checkable
class Algorithm(Protocol):
  """A federated algorithm: `init` and one `round` (see `core.loop`)."""
  name: str
  quick_compile: bool
  """Whether the loop's programs of this algorithm compile with `core.loop.QUICK_COMPILE` on
  the CPU (the neural algorithms set it)."""
  tracked_metric: str | None
  """The metric that the loop's blow-up bound watches where the round reports it (None, or
  a metric the round does not report: train_loss)."""

  def init(self, key: jax.Array, data: ClientData, hparams: Any) -> Any:
    """The initial state."""

  def round(self, state: Any, key: jax.Array, data: ClientData,
            hparams: Any) -> tuple[Any, Metrics]:
    """One round: samples its cohort from `key`; returns (state, scalar metrics)."""


@runtime_checkable
class MaskedAlgorithm(Algorithm, Protocol):
  """An algorithm whose round can be run on given clients with some of them masked out
  (static shapes): what the simulated clock (`hetero.timed.Timed`) needs."""

  def masked_round(self, state: Any, key: jax.Array, data: ClientData, hparams: Any,
                   clients: jax.Array, mask: jax.Array | None = None) -> tuple[Any, Metrics]:
    """One round of clients `clients` [c] where `mask` [c] (bool; None: all) is True."""


@runtime_checkable
class Evaluated(Protocol):
  """An algorithm with an evaluation too costly for every round (e.g. test accuracy over
  all clients): the loop calls it every `eval_every` rounds, between chunks."""

  def evaluate(self, state: Any, data: ClientData, hparams: Any) -> Metrics:
    """Scalar metrics of `state` on `data`."""


@runtime_checkable
class Checked(Protocol):
  """An algorithm that checks a run's inputs before anything is traced or compiled (the
  loop calls `check` through `core.checks.check_run`)."""

  def check(self, data: ClientData, hparams: Any) -> None:
    """Raises ValueError on one run's `data` that it cannot run on (and on `hparams`, whole:
    they may carry a leading sweep axis); warns on inputs that run but mean little. Arrays
    are numpy where concrete, `jax.ShapeDtypeStruct` where traced (`core.checks`)."""
