"""Data modes of linear runs (`core.protocols.ClientData`): what each round's clients train on.

All have `num_clients`, `B_star`, `batch(key, clients)`, `refit_models(B)`,
`model_metrics(theta_fn)` and `check(rep_dim, heads)`:
- `FixedData`: a fixed local dataset per client (X [n, m, d], y [n, m]); optional held-out
  test samples. Also how users bring their own data (`client_data`).
- `FreshData`: every time a client is sampled it draws m fresh samples, generated on the
  device from the round key (FedRep Algorithm 2). Memory is O(block of clients), not
  O(rounds) nor O(clients x samples). sampler="statistics" draws only what a FedRep round
  uses (`fresh_statistics`), exactly in distribution.
- `PopulationData`: the population losses of a ground truth (`Targets`): exact gradients,
  no samples.

FixedData and FreshData also give blocked rounds their clients' designs (`design`: data in
the round's `basis`) and the partition of their leaves over devices (`client_specs`).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from fedjax_rep.core import checks
from fedjax_rep.core import struct
from fedjax_rep.linear import fresh_statistics
from fedjax_rep.linear import heads as heads_lib
from fedjax_rep.linear import metrics as metrics_lib
from fedjax_rep.linear.problem import LinearProblem, check_noise_std, sample, sample_clients
from fedjax_rep.linear.checks import check_scale


@struct.dataclass
class FixedData:
  """Fixed local datasets of n clients, each padded to m samples.

  Datasets of different sizes are padded to m with zero rows; `counts` gives the number of
  real samples of each client.

  Attributes:
    X: [clients, samples, dim] float array.
    y: [clients, samples] float array.
    X_test: [clients, test_samples, dim] float array of held-out samples, or None.
    y_test: [clients, test_samples] float array, or None.
    B_star: [dim, rep_dim] float array, the ground-truth subspace, or None.
    counts: [clients] int array of real samples per client, in [1, samples] (None: all are
      real).
    models: [clients, dim] float array of ground-truth models theta_i* (e.g.
      under-parameterised), or None.
    test_counts: [clients] int array of real test samples per client, in [0, test_samples]
      (a client with 0 is left out of test_error; None: all are real).
  """
  X: jax.Array
  y: jax.Array
  X_test: jax.Array | None = None
  y_test: jax.Array | None = None
  B_star: jax.Array | None = None
  counts: jax.Array | None = None
  models: jax.Array | None = None
  test_counts: jax.Array | None = None

  def check_layout(self) -> None:
    """Raises ValueError unless the arrays' shapes agree: X [n, m, d] with n, m >= 1, y [n, m],
    counts [n] integers in [1, m] (values where concrete), X_test [n, t, d] with y_test
    [n, t], test_counts [n] (only with X_test) integers in [0, t] and not all 0 (values where
    concrete), models [n, d], B_star [d, k'] with k' >= 1."""
    X, y = self.X, self.y
    if len(X.shape) != 3 or tuple(y.shape) != tuple(X.shape[:2]):
      raise ValueError(f"client data must be X [clients, samples, dim] and y [clients, samples]; "
                       f"got X {tuple(X.shape)} and y {tuple(y.shape)}")
    n, m, d = X.shape
    checks.in_range("num_clients (X.shape[0])", n, 1,
                    advice="pass the data of at least one client")
    checks.in_range("samples per client (X.shape[1])", m, 1,
                    advice="every client needs at least one sample")
    if self.counts is not None:
      rule = f"counts must be [clients={n}] integers in [1, samples={m}]"
      if tuple(self.counts.shape) != (n,) or not jnp.issubdtype(self.counts.dtype, jnp.integer):
        raise ValueError(f"{rule}; got shape {tuple(self.counts.shape)} and dtype "
                         f"{self.counts.dtype}")
      bad = np.flatnonzero((self.counts < 1) | (self.counts > m)) if checks.concrete(
          self.counts) else []
      if len(bad):
        raise ValueError(f"{rule}; got counts[{bad[0]}] = {self.counts[bad[0]]} (client "
                         f"{bad[0]}): a client needs at least one sample; drop empty clients")
    if (self.X_test is None) != (self.y_test is None):
      raise ValueError("pass both X_test and y_test, or neither")
    if self.X_test is not None:
      X_test, y_test = self.X_test, self.y_test
      if (len(X_test.shape) != 3 or X_test.shape[0] != n or X_test.shape[2] != d
          or tuple(y_test.shape) != tuple(X_test.shape[:2])):
        raise ValueError(f"test data must be X_test [{n}, samples, {d}] and y_test [{n}, "
                         f"samples]; got {tuple(X_test.shape)} and {tuple(y_test.shape)}")
    if self.test_counts is not None:
      self.check_test_counts()
    if self.models is not None and tuple(self.models.shape) != (n, d):
      raise ValueError(f"models must be [clients={n}, dim={d}]; got {tuple(self.models.shape)}")
    if self.B_star is not None and (len(self.B_star.shape) != 2 or self.B_star.shape[0] != d
                                    or self.B_star.shape[1] < 1):
      raise ValueError(f"B_star must be [dim={d}, rep_dim >= 1]; got "
                       f"{tuple(self.B_star.shape)}")

  def check_test_counts(self) -> None:
    """Raises ValueError unless test_counts (with X_test) are [n] integers in [0, t] and not
    all 0: a test_error over no client would be NaN, which stops a run as diverged."""
    if self.X_test is None:
      raise ValueError("test_counts given without X_test and y_test: pass the test data too")
    n, t = self.X_test.shape[:2]
    rule = f"test_counts must be [clients={n}] integers in [0, test samples={t}]"
    if (tuple(self.test_counts.shape) != (n,)
        or not jnp.issubdtype(self.test_counts.dtype, jnp.integer)):
      raise ValueError(f"{rule}; got shape {tuple(self.test_counts.shape)} and dtype "
                       f"{self.test_counts.dtype}")
    if not checks.concrete(self.test_counts):
      return
    bad = np.flatnonzero((self.test_counts < 0) | (self.test_counts > t))
    if len(bad):
      raise ValueError(f"{rule}; got test_counts[{bad[0]}] = {self.test_counts[bad[0]]} "
                       f"(client {bad[0]})")
    if not self.test_counts.any():
      raise ValueError("test_counts are all 0: no client has a test sample, so test_error "
                       "would be NaN; pass X_test=None for a run without a test set")

  def check(self, rep_dim: int, heads: bool = True) -> None:
    """Raises ValueError on data a linear algorithm with rep_dim k cannot run on: a bad layout
    (`check_layout`), k > d, non-finite values (naming the client and sample), values too
    large for float32 (`check_scale`). Warns on clients whose X is all zero, on clients
    without test samples (test_counts 0: left out of test_error) and, where clients fit
    heads (`heads`), on clients with fewer samples than k. Values are checked where
    concrete (`core.checks`)."""
    self.check_layout()
    n, m, d = self.X.shape
    checks.in_range("rep_dim", rep_dim, 1, d, "the data's dimension d", "choose a smaller rep_dim")
    for name in ("X", "y", "X_test", "y_test"):
      checks.finite(name, getattr(self, name), ("client", "sample"))
    checks.finite("models", self.models, ("client",), "ground-truth models must be finite")
    checks.finite("B_star", self.B_star, advice="the ground-truth subspace must be finite")
    if not checks.concrete(self.X, self.y):
      return
    check_scale("X", "y", self.X, self.y)
    if self.X_test is not None:
      check_scale("X_test", "y_test", self.X_test, self.y_test)
    zero = np.flatnonzero(~checks.any_nonzero(self.X, (1, 2)))
    if zero.size:
      checks.warn(f"{zero.size} of {n} clients have only zeros in X "
                  f"({checks.clients_text(zero)}): they carry no signal for the representation "
                  f"or their heads; drop them or check how the data were built")
    untested = (np.flatnonzero(self.test_counts == 0) if checks.concrete(self.test_counts)
                else [])
    if len(untested):
      checks.warn(f"{len(untested)} of {n} clients have no test samples "
                  f"({checks.clients_text(untested)}): they are left out of test_error "
                  f"(test_clients counts the clients tested)")
    counts = np.full(n, m) if self.counts is None else self.counts
    few = np.flatnonzero(counts < rep_dim)
    if heads and few.size:
      checks.warn(f"{few.size} of {n} clients have fewer samples than rep_dim = {rep_dim} "
                  f"({checks.clients_text(few)}): their least-squares heads are "
                  f"underdetermined (minimum-norm) and say little about the representation; "
                  f"give every client >= {rep_dim} samples or lower rep_dim")

  def sample_counts(self, clients: jax.Array) -> jax.Array:
    """Number of real samples [c] of clients `clients` [c]."""
    if self.counts is None:
      return jnp.full(clients.shape, self.samples, jnp.float32)
    return self.counts[clients].astype(jnp.float32)

  @property
  def num_clients(self) -> int:
    return self.X.shape[0]

  @property
  def samples(self) -> int:
    return self.X.shape[1]

  @property
  def dim(self) -> int:
    return self.X.shape[2]

  def batch(self, key: jax.Array, clients: jax.Array):
    """The local datasets (X [c, m, d], y [c, m]) of clients `clients` [c]."""
    del key
    if clients.shape[0] == self.num_clients:  # full participation: clients == arange(n)
      return self.X, self.y
    return self.X[clients], self.y[clients]

  def basis(self, B: jax.Array) -> None:
    """None: a round works on the clients' data in R^d."""
    del B

  def design(self, key: jax.Array, clients: jax.Array, basis: None, offset=0,
             contiguous: bool = False):
    """(X [c, m, d], y [c, m]) of clients `clients` [c] (local indices; `offset` unused).
    contiguous=True: clients are clients[0] + arange(c), read as a slice (no gather)."""
    del key, basis, offset
    if not contiguous:
      return self.X[clients], self.y[clients]
    size = clients.shape[0]
    return (jax.lax.dynamic_slice_in_dim(self.X, clients[0], size),
            jax.lax.dynamic_slice_in_dim(self.y, clients[0], size))

  def client_specs(self, spec: PartitionSpec) -> "FixedData":
    """The data with `spec` at its per-client leaves and P() (replicated) at B_star."""
    per_client = {name: None if getattr(self, name) is None else spec
                  for name in ("X", "y", "X_test", "y_test", "counts", "models",
                               "test_counts")}
    return self.replace(**per_client, B_star=None if self.B_star is None else PartitionSpec())

  def refit_models(self, B: jax.Array) -> jax.Array:
    """theta_i = B w_i [n, d] with each client's least-squares head on its own data for B."""
    return heads_lib.fit_models(self.X, self.y, B)

  def model_metrics(self, theta_fn) -> dict:
    """test_error (with a test set; with test_counts, the mean over the clients tested of
    each one's mean over its test samples, and test_clients, how many) and
    model_error (with ground-truth models) of the personal models theta_fn() [n, d];
    theta_fn is called only if one of them applies."""
    if self.X_test is None and self.models is None:
      return {}
    theta, metrics = theta_fn(), {}
    if self.X_test is not None:
      metrics["test_error"] = metrics_lib.mean_squared_error(theta, self.X_test, self.y_test,
                                                             self.test_counts)
    if self.test_counts is not None:
      metrics["test_clients"] = jnp.sum(self.test_counts > 0, dtype=jnp.int32)
    if self.models is not None:
      metrics["model_error"] = metrics_lib.model_error(theta, self.models)
    return metrics


@struct.dataclass
class ProblemData:
  """Data drawn from a known ground truth `problem` (base of FreshData, PopulationData)."""
  problem: LinearProblem

  @property
  def num_clients(self) -> int:
    return self.problem.num_clients

  @property
  def dim(self) -> int:
    return self.problem.B_star.shape[0]

  @property
  def B_star(self) -> jax.Array:
    return self.problem.B_star

  def check(self, rep_dim: int, heads: bool = True) -> None:
    """Raises ValueError on a problem a linear algorithm with rep_dim k cannot run on: a bad
    layout (`LinearProblem.check_layout`), k > d, non-finite B_star, W_star or noise_std,
    noise_std < 0 (values where concrete). `heads`: see `FreshData.check`."""
    del heads
    self.problem.check_layout()
    checks.in_range("rep_dim", rep_dim, 1, self.dim, "the data's dimension d",
                    "choose a smaller rep_dim")
    checks.finite("B_star", self.problem.B_star,
                  advice="the ground-truth subspace must be finite")
    checks.finite("W_star", self.problem.W_star, ("client",), "ground-truth heads must be finite")
    check_noise_std(self.problem.noise_std)

  def client_specs(self, spec: PartitionSpec) -> "ProblemData":
    """The data with `spec` at the heads W* and P() (replicated) elsewhere."""
    replicated = PartitionSpec()
    return self.replace(problem=LinearProblem(B_star=replicated, W_star=spec,
                                              noise_std=replicated))

  def refit_models(self, B: jax.Array) -> None:
    """None: there are no fixed local datasets to refit heads on (clients keep theirs)."""
    del B

  def model_metrics(self, theta_fn) -> dict:
    """No held-out data: nothing to measure beyond the round's own metrics."""
    del theta_fn
    return {}


SAMPLERS = ("direct", "statistics")


@struct.dataclass
class FreshData(ProblemData):
  """Fresh samples per round from a ground truth: m new samples per sampled client.

  sampler "direct" draws X [m, d] and y (the reference); "statistics" lets FedRep rounds
  draw only A = X Q [m, 2k] and y in the round's basis Q of span[B, B*] plus one [d, k]
  draw per round (`fresh_statistics`): the same distribution of the round's outputs with
  m(2k+1) normals per client instead of m(d+1). `batch` (other algorithms, the
  initialisation) always samples directly.

  Attributes:
    problem: the ground truth (`LinearProblem`: B_star [d, k], W_star [n, k]).
    samples: number of samples m each sampled client draws per round (static).
    sampler: "direct" or "statistics" (static).
  """
  samples: int = struct.static_field()
  sampler: str = struct.static_field(default="direct")

  def __post_init__(self):
    if self.sampler not in SAMPLERS:
      raise ValueError(f"FreshData sampler must be one of {SAMPLERS}, got {self.sampler!r}")
    checks.positive_ints("FreshData", samples=self.samples)

  def check(self, rep_dim: int, heads: bool = True) -> None:
    """`ProblemData.check`, and where clients fit heads (`heads`) a warning when every
    client draws fewer samples per round than k."""
    super().check(rep_dim)
    if heads and self.samples < rep_dim:
      checks.warn(f"every client draws samples = {self.samples} < rep_dim = {rep_dim} per "
                  f"round: the least-squares heads are underdetermined (minimum-norm) and say "
                  f"little about the representation; draw >= {rep_dim} samples or lower rep_dim")

  def sample_counts(self, clients: jax.Array) -> jax.Array:
    return jnp.full(clients.shape, self.samples, jnp.float32)

  def batch(self, key: jax.Array, clients: jax.Array):
    """m fresh samples (X [c, m, d], y [c, m]) for each client in `clients` [c].

    The barrier makes XLA generate the samples once, instead of fusing the generator into
    each of their consumers (which would draw them twice per round).
    """
    return jax.lax.optimization_barrier(sample_clients(key, self.problem, clients, self.samples))

  def basis(self, B: jax.Array) -> jax.Array | None:
    """The round's basis: Q [d, 2k] containing span[B, B*] ("statistics"), else None."""
    if self.sampler == "direct":
      return None
    return fresh_statistics.basis(B, self.problem.B_star)

  def design(self, key: jax.Array, clients: jax.Array, basis: jax.Array | None, offset=0,
             contiguous: bool = False):
    """Fresh (V [c, m, p], y [c, m]) of clients `clients` [c] (local indices; client ids
    offset + clients seed them by fold_in(key, id)): V = X [c, m, d] (basis None, the
    samples of `batch`) or V = X Q [c, m, p] drawn directly (`fresh_statistics.sample`).
    No optimization barrier: the draw's labels and a FedRep round both multiply V's rows
    [c m, p], so XLA generates V once; a barrier here made it generate the statistics
    sampler's V twice (for two shapes of it)."""
    problem = self.problem
    heads = (jax.lax.dynamic_slice_in_dim(problem.W_star, clients[0], clients.shape[0])
             if contiguous else problem.W_star[clients])
    ids = clients + offset
    if basis is None:
      return sample(key, problem.B_star, heads, problem.noise_std, self.samples, ids)
    return fresh_statistics.sample(key, basis.T @ problem.B_star, heads, problem.noise_std,
                                   self.samples, ids)


@struct.dataclass
class Targets:
  """A population batch of clients: their ground-truth models.

  Attributes:
    theta_star: [clients, dim] float array, theta_i* = B* w_i*.
  """
  theta_star: jax.Array


@struct.dataclass
class PopulationData(ProblemData):
  """Population losses f_i(B, w) = 1/2 ||B w - B* w_i*||^2: exact gradients, no samples.

  The setting of the FedAvg-FT theory; `batch` gives the clients' `Targets`.

  Attributes:
    problem: the ground truth (`LinearProblem`: B_star [d, k], W_star [n, k]).
  """

  def sample_counts(self, clients: jax.Array) -> jax.Array:
    """Every client weighs the same in the population objective."""
    return jnp.ones(clients.shape, jnp.float32)

  def batch(self, key: jax.Array, clients: jax.Array) -> Targets:
    """The targets theta_i* [c, d] of clients `clients` [c]."""
    del key
    return Targets(theta_star=self.problem.W_star[clients] @ self.problem.B_star.T)


_sample_clients = jax.jit(sample_clients, static_argnums=3)


def make_fixed_data(key: jax.Array, problem: LinearProblem, samples: int,
                    test_samples: int = 0) -> FixedData:
  """Draws a fixed dataset per client from a ground truth.

  Drawn in one compiled program: its peak memory is the dataset's, without the generator's
  [n, m, d] temporaries of op-by-op execution.

  Args:
    key: PRNG key.
    problem: the ground truth, with n clients.
    samples: number of training samples m per client.
    test_samples: number of held-out samples t per client (0: no test set).

  Returns:
    A `FixedData` with X [n, m, d], y [n, m], B_star [d, k] and, if test_samples > 0,
    X_test [n, t, d] and y_test [n, t] float arrays.

  Raises:
    ValueError: samples not an integer >= 1, test_samples not one >= 0, or a problem of a
      bad layout (`LinearProblem.check_layout`).
  """
  checks.positive_ints("make_fixed_data", samples=samples)
  checks.positive_ints("make_fixed_data", low=0, test_samples=test_samples)
  problem.check_layout()
  key_train, key_test = jax.random.split(key)
  clients = jnp.arange(problem.num_clients)
  X, y = _sample_clients(key_train, problem, clients, samples)
  X_test = y_test = None
  if test_samples:
    X_test, y_test = _sample_clients(key_test, problem, clients, test_samples)
  return FixedData(X=X, y=y, X_test=X_test, y_test=y_test, B_star=problem.B_star)


def client_data(X, y, *, X_test=None, y_test=None, B_star=None, counts=None,
                test_counts=None) -> FixedData:
  """Wraps user-supplied client data as `FixedData`, after checking their layout.

  The layout is checked here (`FixedData.check_layout`), the values when a run starts. For
  datasets of different sizes pass `counts`: client i's real samples are its first
  counts[i] rows; the rest are padding and are set to zero here. Likewise `test_counts` for
  the test sets, where a client may have none (it is left out of test_error).

  Args:
    X: [clients, samples, dim] array-like.
    y: [clients, samples] array-like.
    X_test: [clients, test_samples, dim] array-like of held-out samples, or None.
    y_test: [clients, test_samples] array-like, or None (pass both or neither).
    B_star: [dim, rep_dim] array-like, the ground-truth subspace, or None.
    counts: [clients] int array-like of real samples per client, in [1, samples], or None.
    test_counts: [clients] int array-like of real test samples per client, in [0,
      test_samples] and not all 0, or None (all real); only with X_test.

  Returns:
    A `FixedData` of float32 arrays (int32 counts), padding rows zeroed.

  Raises:
    ValueError: before the arrays are converted, if the shapes disagree, counts are no
      integers or a count is out of range (`FixedData.check_layout`).
  """
  arrays = dict(X=X, y=y, X_test=X_test, y_test=y_test, B_star=B_star, counts=counts,
                test_counts=test_counts)
  given = FixedData(**{name: None if a is None else a if hasattr(a, "shape") else np.asarray(a)
                       for name, a in arrays.items()})
  checks.host(given).check_layout()
  as_array = lambda a, dtype=jnp.float32: None if a is None else jnp.asarray(a, dtype)
  data = FixedData(X=as_array(X), y=as_array(y), X_test=as_array(X_test),
                   y_test=as_array(y_test), B_star=as_array(B_star),
                   counts=as_array(counts, jnp.int32),
                   test_counts=as_array(test_counts, jnp.int32))

  def zero_padding(X, y, counts):  # X [n, m, d], y [n, m] with rows >= counts [n] zeroed
    real = jnp.arange(X.shape[1])[None, :] < counts[:, None]
    return jnp.where(real[..., None], X, 0.0), jnp.where(real, y, 0.0)

  if counts is not None:
    X, y = zero_padding(data.X, data.y, data.counts)
    data = data.replace(X=X, y=y)
  if test_counts is not None:
    X_test, y_test = zero_padding(data.X_test, data.y_test, data.test_counts)
    data = data.replace(X_test=X_test, y_test=y_test)
  return data
