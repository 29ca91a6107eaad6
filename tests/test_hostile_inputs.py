"""Hostile inputs through the Python API: each is a one-line ValueError before anything
compiles, or a run with finite results (and a one-line warning where it means little)."""

import dataclasses
import re
import warnings
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.core import checks

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

N, M, D, K = 6, 4, 5, 2  # the linear base case: clients, samples, dim, rep_dim
HP = fr.LinearHparams(lr=np.float32(0.05), head_lr=np.float32(0.05))
NN_HP = fr.nn_hparams(lr=0.05)
KEY = jax.random.key(0)


def normal(*shape, seed=0):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


X, Y = normal(N, M, D), normal(N, M, seed=1)


def with_entry(array, index, value):
  """A copy of `array` with `value` at `index`."""
  array = array.copy()
  array[index] = value
  return array


def fedrep(**fields):
  return fr.FedRep(**{"rep_dim": K, "cohort": 3, **fields})


def run_linear(algorithm, data, **kwargs):
  return fr.run(algorithm, data, HP, KEY, 2, progress=False, **kwargs)


def problem_with(**fields):
  """A linear ground truth (d = D, k = K, N clients) with `fields` replaced."""
  problem = fr.LinearProblem(B_star=np.linalg.qr(normal(D, K))[0], W_star=normal(N, K),
                             noise_std=np.float32(0.1))
  return problem.replace(**fields)


def linear_state(algorithm, **fields):
  """A run of `algorithm` on the base data from its initial state with `fields` replaced."""
  data = fr.client_data(X, Y)
  state = fr.init_state(algorithm, data, HP, KEY).replace(**fields)
  return lambda: run_linear(algorithm, data, state=state)


def neural_data(clients=4, seed=0, **fields):
  """Tiny ClientDatasets: x [clients, 5, 2, 2, 1], 3 test rows, 10 classes."""
  rng = np.random.default_rng(seed)
  data = fr.ClientDatasets(
      x=rng.normal(size=(clients, 5, 2, 2, 1)).astype(np.float32),
      y=rng.integers(0, 10, (clients, 5)).astype(np.int32),
      counts=np.full(clients, 5, np.int32),
      x_test=rng.normal(size=(clients, 3, 2, 2, 1)).astype(np.float32),
      y_test=rng.integers(0, 10, (clients, 3)).astype(np.int32),
      test_counts=np.full(clients, 3, np.int32), num_classes=10)
  return data.replace(**fields)


MODEL = fr.make_model("digits-mlp", 10)


def neural(name="fedavg", cohort=2):
  return fr.make_neural_algorithm(name, model=MODEL, cohort=cohort, batch_size=5,
                                  client_group=None)


def run_neural(algorithm, data, **kwargs):
  return fr.run(algorithm, data, NN_HP, KEY, 1, progress=False, **kwargs)


def neural_state(**change):
  """A run of neural FedRep from its initial state with leaves changed by `change`."""
  algorithm, data = neural("fedrep"), neural_data()
  state = fr.init_state(algorithm, data, NN_HP, KEY)
  state = state.replace(**{part: {**getattr(state, part), **fn(getattr(state, part))}
                           for part, fn in change.items()})
  return lambda: run_neural(algorithm, data, state=state)


def sweep_runs(second_X):
  """Two runs of FedRep as one sweep over data (the base data, then X = second_X)."""
  data = fr.stack([fr.client_data(X, Y), fr.client_data(second_X, Y)])
  keys = jax.random.split(KEY)
  return lambda: fr.run(fedrep(), data, HP, keys, 2, sweep_axes=(0, None, 0), progress=False)


@dataclasses.dataclass
class Case:
  """A hostile input: setup() builds what the API gets (compiling if it must) and returns
  the call; the call raises an `error_type` matching `error`, or runs with finite results,
  warning with a message matching `warning` (None: no warning)."""
  name: str
  setup: Callable
  error: str | None = None
  warning: str | None = None
  error_type: type = ValueError


ERRORS = [
    Case("initial B of the wrong shape", lambda: linear_state(fedrep(), B=np.zeros((D + 1, K))),
         r"state\.B has shape \(6, 2\), but fedrep on these data starts from shape \(5, 2\)"),
    Case("heads of the wrong shape", lambda: linear_state(fedrep(), heads=np.zeros((N, K + 1))),
         r"state\.heads has shape \(6, 3\), but fedrep .* \(6, 2\)"),
    Case("NaN in the initial B", lambda: linear_state(
        fedrep(), B=with_entry(np.ones((D, K)), (1, 0), np.nan)),
         r"state\.B\[1, 0\] = nan is not finite"),
    Case("FedAvg head of the wrong shape", lambda: linear_state(
        fr.FedAvg(rep_dim=K, cohort=3), w=np.zeros(K + 1)), r"state\.w has shape \(3,\)"),
    Case("FLUTE heads of another client count", lambda: linear_state(
        fr.Flute(rep_dim=K), heads=np.zeros((N - 1, K))), r"state\.heads has shape \(5, 2\)"),
    Case("fine-tuning from a B of the wrong shape", lambda: lambda: fr.fine_tuned_models(
        np.zeros((D + 1, K)), np.zeros(K), (X, Y), 0.02, 3),
         r"the model must be B \[dim=5, k\] and w \[k\]; got B \(6, 2\) and w \(2,\)"),
    Case("new clients on a B of the wrong shape", lambda: lambda: fr.new_client_error(
        KEY, np.zeros((D + 1, K)), np.zeros((D, K)), 0.1, (2,)),
         r"the model must be B \[dim=5, k\]; got B \(6, 2\)"),
    Case("cohort larger than the clients", lambda: lambda: run_linear(
        fedrep(cohort=N + 1), fr.client_data(X, Y)),
         r"cohort = 7 is out of range: it must be in \[1, 6\] \(6 = the number of clients\)"),
    Case("FedAvg cohort larger than the clients", lambda: lambda: run_linear(
        fr.FedAvg(rep_dim=K, cohort=N + 1), fr.client_data(X, Y)), r"cohort = 7 is out of"),
    Case("simulated clock's cohort larger than the clients", lambda: lambda: fr.run(
        fr.Timed(fedrep(), fr.fixed_speeds(N), cohort=N + 1), fr.client_data(X, Y),
        fr.timed_hparams(HP, fr.fixed_participants(N + 1, N + 1, 2)), KEY, 2, progress=False),
         r"cohort = 7 is out of range"),
    Case("simulated clock given its inner algorithm's hparams", lambda: lambda: run_linear(
        fr.Timed(fedrep(), fr.fixed_speeds(N), cohort=N), fr.client_data(X, Y)),
         r"timed takes TimedHparams \(fr\.timed_hparams", error_type=TypeError),
    Case("zero clients", lambda: lambda: run_linear(fedrep(), fr.FixedData(X[:0], Y[:0])),
         r"num_clients \(X\.shape\[0\]\) = 0 is out of range: it must be >= 1"),
    Case("zero clients through client_data", lambda: lambda: fr.client_data(X[:0], Y[:0]),
         r"num_clients \(X\.shape\[0\]\) = 0"),
    Case("empty data", lambda: lambda: run_linear(fedrep(), fr.FixedData(X[:, :0], Y[:, :0])),
         r"samples per client \(X\.shape\[1\]\) = 0 is out of range"),
    Case("an empty client", lambda: lambda: run_linear(fedrep(), fr.FixedData(
        X, Y, counts=np.array([M, 0, M, M, M, M]))), r"counts\[1\] = 0 \(client 1\)"),
    Case("rep_dim larger than the dimension", lambda: lambda: run_linear(
        fedrep(rep_dim=D + 1), fr.client_data(X, Y)),
         r"rep_dim = 6 is out of range: it must be in \[1, 5\] \(5 = the data's dimension d\)"),
    Case("FLUTE rep_dim larger than the dimension", lambda: lambda: run_linear(
        fr.Flute(rep_dim=D + 1), fr.client_data(X, Y)), r"rep_dim = 6 is out of range"),
    Case("rep_dim 0 at construction", lambda: lambda: fr.FedRep(rep_dim=0, cohort=3),
         r"FedRep: rep_dim must be an integer >= 1, got 0"),
    Case("NaN in X", lambda: lambda: run_linear(fedrep(), fr.client_data(
        with_entry(X, (3, 2, 1), np.nan), Y)),
         r"X\[3, 2, 1\] = nan \(client 3, sample 2\) is not finite"),
    Case("inf in y", lambda: lambda: run_linear(fr.Flute(rep_dim=K), fr.client_data(
        X, with_entry(Y, (4, 1), np.inf))), r"y\[4, 1\] = inf \(client 4, sample 1\)"),
    Case("NaN in the test set", lambda: lambda: run_linear(fedrep(), fr.client_data(
        X, Y, X_test=with_entry(X, (0, 3, 0), np.nan), y_test=Y)),
         r"X_test\[0, 3, 0\] = nan \(client 0, sample 3\)"),
    Case("NaN in a fresh-data problem", lambda: lambda: run_linear(fedrep(), fr.FreshData(
        problem_with(W_star=with_entry(normal(N, K), (2, 0), np.nan)), M)),
         r"W_star\[2, 0\] = nan \(client 2\) is not finite"),
    Case("huge values", lambda: lambda: run_linear(fedrep(), fr.client_data(X * 1e20, Y)),
         r"X and y are too large for float32: .* \(largest at client \d, sample \d\)"),
    Case("NaN in one run of a sweep", lambda: sweep_runs(with_entry(X, (5, 0, 0), np.nan)),
         r"run 1 of the sweep: X\[5, 0, 0\] = nan \(client 5, sample 0\)"),
    Case("neural: NaN in x", lambda: lambda: run_neural(neural(), neural_data(
        x=with_entry(neural_data().x, (2, 1, 0, 0, 0), np.nan))),
         r"x\[2, 1, 0, 0, 0\] = nan \(client 2, sample 1\) is not finite"),
    Case("neural: inf in x_test", lambda: lambda: run_neural(neural(), neural_data(
        x_test=with_entry(neural_data().x_test, (3, 0, 1, 0, 0), np.inf))),
         r"x_test\[3, 0, 1, 0, 0\] = inf \(client 3, sample 0\)"),
    Case("neural: a label outside the classes", lambda: lambda: run_neural(
        neural(), neural_data(y=with_entry(neural_data().y, (1, 4), 12))),
         r"y\[1, 4\] = 12 \(client 1, sample 4\) is not a class in \[0, 10\)"),
    Case("neural: cohort larger than the clients", lambda: lambda: run_neural(
        neural(cohort=5), neural_data()), r"cohort = 5 is out of range: it must be in \[1, 4\]"),
    Case("neural: zero clients", lambda: lambda: run_neural(neural(), neural_data(clients=0)),
         r"num_clients \(x\.shape\[0\]\) = 0 is out of range"),
    Case("neural: no training sample", lambda: lambda: run_neural(neural(), neural_data(
        counts=np.zeros(4, np.int32))), r"counts are all 0"),
    Case("neural: shared params of the wrong shape", lambda: neural_state(
        shared=lambda s: {"body/fc1/kernel": np.zeros((3, 64), np.float32)}),
         r"state\.shared\['body/fc1/kernel'\] has shape \(3, 64\), but fedrep .* \(4, 64\)"),
    Case("neural: personal heads of the wrong shape", lambda: neural_state(
        personal=lambda p: {"head/kernel": p["head/kernel"][:, :, :3]}),
         r"state\.personal\['head/kernel'\] has shape \(4, 32, 3\)"),
]


@pytest.mark.parametrize("case", ERRORS, ids=lambda case: case.name)
def test_hostile_input_is_a_clear_error_before_any_compilation(case, compiles):
  call = case.setup()
  compiles.reset()
  with pytest.raises(case.error_type, match=case.error) as error:
    call()
  assert "\n" not in str(error.value)
  assert compiles.count == 0, compiles.names


def test_inside_a_users_jit_only_shapes_are_checked():
  def init(X, rep_dim):
    return fr.init_state(fedrep(rep_dim=rep_dim), fr.FixedData(X, Y), HP, KEY)

  init = jax.jit(init, static_argnums=1)
  assert init(with_entry(X, (0, 0, 0), np.nan), K).B.shape == (D, K)  # values: traced
  with pytest.raises(ValueError, match=r"rep_dim = 6 is out of range"):
    init(X, D + 1)


def our_warnings(record) -> list[str]:
  return [str(w.message) for w in record if "fedjax_rep" in w.filename]


def assert_finite(result):
  assert not result.metrics["diverged"].any()
  chex.assert_tree_all_finite(result.metrics)
  chex.assert_tree_all_finite([leaf for leaf in jax.tree.leaves(result.state)
                               if np.issubdtype(np.asarray(leaf).dtype, np.inexact)])


RUNS = [
    Case("fewer samples than rep_dim", lambda: lambda: run_linear(
        fedrep(), fr.client_data(X, Y, counts=[M, 1, M, 1, M, M])),
         warning=r"^2 of 6 clients have fewer samples than rep_dim = 2 \(clients 1, 3\)"),
    Case("an all-zero client", lambda: lambda: run_linear(fedrep(), fr.client_data(
        with_entry(X, 4, 0.0), with_entry(Y, 4, 0.0))),
         warning=r"^1 of 6 clients have only zeros in X \(client 4\)"),
    Case("duplicated samples", lambda: lambda: run_linear(fedrep(), fr.client_data(
        np.repeat(X[:, :1], M, axis=1), np.repeat(Y[:, :1], M, axis=1)))),
    Case("one client", lambda: lambda: run_linear(fedrep(cohort=1), fr.client_data(
        X[:1], Y[:1]))),
    Case("d = k", lambda: lambda: run_linear(fedrep(), fr.client_data(X[..., :K], Y))),
    Case("every client draws fewer fresh samples than rep_dim", lambda: lambda: run_linear(
        fedrep(), fr.FreshData(problem_with(), 1)),
         warning=r"^every client draws samples = 1 < rep_dim = 2 per round"),
    Case("neural: an empty client", lambda: lambda: run_neural(neural(), neural_data(
        counts=np.array([0, 5, 5, 5], np.int32))),
         warning=r"^1 of 4 clients have no training samples \(client 0\)"),
    Case("neural: an all-zero client", lambda: lambda: run_neural(neural(), neural_data(
        x=with_entry(neural_data().x, 2, 0.0))),
         warning=r"^1 of 4 clients have only zeros in their training inputs x \(client 2\)"),
]


@pytest.mark.parametrize("case", RUNS, ids=lambda case: case.name)
def test_input_that_runs_gives_finite_results_and_warns_when_meaningless(case):
  call = case.setup()
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    result = call()
  messages = our_warnings(record)
  assert all("\n" not in m for m in messages)
  if case.warning is None:
    assert not messages
  else:
    assert len(messages) == 1 and re.search(case.warning, messages[0]), messages
  assert_finite(result)


VALUE_CASES = [case for case in ERRORS + RUNS
               if re.search(r"not finite|too large|not a class|counts|only zeros|fewer samples",
                            case.error or case.warning or "")]


@pytest.fixture
def arrays_on_an_accelerator(monkeypatch):
  """Every array the checks get is a jax array that `checks.on_accelerator` takes for one
  on a GPU (CPU arrays stand in for it)."""
  host = checks.host
  monkeypatch.setattr(checks, "on_accelerator", lambda leaf: isinstance(leaf, jax.Array))
  monkeypatch.setattr(checks, "host", lambda tree: host(jax.tree.map(
      lambda leaf: jnp.asarray(leaf) if isinstance(leaf, np.ndarray) else leaf, tree)))


@pytest.mark.parametrize("case", VALUE_CASES, ids=lambda case: case.name)
def test_values_on_an_accelerator_are_checked_there_with_the_same_messages(
    case, arrays_on_an_accelerator):
  call = case.setup()
  if case.error is not None:
    with pytest.raises(case.error_type, match=case.error):
      call()
    return
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    call()
  messages = our_warnings(record)
  assert len(messages) == 1 and re.search(case.warning, messages[0]), messages


def test_data_on_an_accelerator_are_not_copied_to_the_host(arrays_on_an_accelerator):
  """Sound data on an accelerator pass the checks as the very arrays given (no host copy)."""
  data = fr.client_data(X, Y)
  assert checks.host(data).X is data.X
  state = fr.init_state(fedrep(), data, HP, KEY)
  chex.assert_tree_all_finite(state.B)


# The property: one shape (4 clients, 3 samples, d = 3) so that examples share programs;
# about half the examples carry faults (each a clear error), all carry benign oddities (zero
# and duplicated clients, fewer samples than k, k = d).
PN, PM, PD = 4, 3, 3
FAULTS = {"nan": "is not finite", "inf": "is not finite", "huge": "too large for float32",
          "empty client": "counts", "rep_dim > d": "rep_dim", "cohort > n": "cohort"}


@pytest.mark.slow
@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(algorithm=st.sampled_from(("fedrep", "fedavg", "flute")),
                  rep_dim=st.sampled_from((1, PD)),
                  kinds=st.lists(st.sampled_from(("normal", "duplicated", "zero")),
                                 min_size=PN, max_size=PN),
                  counts=st.lists(st.integers(1, PM), min_size=PN, max_size=PN),
                  faults=st.one_of(st.just([]), st.lists(st.sampled_from(sorted(FAULTS)),
                                                         min_size=1, max_size=2)),
                  client=st.integers(0, PN - 1), seed=st.integers(0, 2 ** 16))
def test_any_configuration_and_client_data_is_a_clear_error_or_a_finite_run(
    algorithm, rep_dim, kinds, counts, faults, client, seed):
  X, y = normal(PN, PM, PD, seed=seed), normal(PN, PM, seed=seed + 1)
  for c, kind in enumerate(kinds):
    if kind == "duplicated":
      X[c], y[c] = X[c, :1], y[c, :1]
    elif kind == "zero":
      X[c] = 0.0
  for fault, value in (("nan", np.nan), ("inf", -np.inf), ("huge", 1e20)):
    if fault in faults:
      X[client, 0, 0] = value
  counts = np.array(counts)
  if "empty client" in faults:
    counts[(client + 1) % PN] = 0
  real = np.arange(PM) < counts[:, None]  # padding rows are zero
  X, y = np.where(real[..., None], X, 0.0), np.where(real, y, 0.0)
  data = fr.FixedData(X=X, y=y, counts=counts)
  rep_dim = PD + 1 if "rep_dim > d" in faults else rep_dim
  cohort = PN + 1 if "cohort > n" in faults else 2
  make = {"fedrep": lambda: fr.FedRep(rep_dim=rep_dim, cohort=cohort),
          "fedavg": lambda: fr.FedAvg(rep_dim=rep_dim, cohort=cohort),
          "flute": lambda: fr.Flute(rep_dim=rep_dim)}[algorithm]
  expected = {FAULTS[f] for f in faults if not (f == "cohort > n" and algorithm == "flute")}
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always")
    try:
      result = run_linear(make(), data)
    except ValueError as error:  # the first fault checked wins
      assert any(pattern in str(error) for pattern in expected), (expected, error)
      assert "\n" not in str(error)
      return
  assert not expected, expected
  assert_finite(result)
  messages = our_warnings(record)
  zero = not X.any(axis=(1, 2)).all()
  assert zero == any("only zeros in X" in m for m in messages), messages
  few = algorithm != "fedavg" and (counts < rep_dim).any()
  assert few == any("fewer samples than rep_dim" in m for m in messages), messages
