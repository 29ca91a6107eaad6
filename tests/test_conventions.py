"""The authors' training conventions (`nn.conventions`: the hparams options no_bias_decay,
uniform_average, average_untrained and feature_sum, and FLUTE*'s `head_first`) against the
float64 numpy references (nn_reference, flute_reference): test_nn_reference's and
test_flute_neural's MLP and data (clients of unequal sizes), rounds under jit, float32
tolerance. Each test also checks that its convention changes the reference's numbers, so an
engine that ignored it would fail.

The sharded run (average_untrained and uniform_average over 2 emulated devices) runs in a
child process: this file run as a script, as tests/test_nn_sharding.py does.
"""

import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.core import sharding
from fedjax_rep.nn import hparams as hparams_lib
from fedjax_rep.nn import partial
from fedjax_rep.nn import program as nn_program
from fedjax_rep.nn import algorithms as nn_algorithms
import flute_reference as fref
import nn_reference as ref
import test_flute_neural as flute_tests
from conftest import emulated_devices_env
from test_nn_reference import (ATOL, MODEL, ROUNDS, RTOL, STRUCTURE, assert_states_close,
                               initial_state, make_data, to_reference)

# The flags of the authors' conventions (`conventions.FLAG_OF`), all on.
AUTHORS = dict(feature_sum=1.0, average_untrained=1.0, no_bias_decay=1.0, uniform_average=1.0)
# Weight decay larger than test_nn_reference's, so that the biases' share shows in 2 rounds.
DECAY = 0.05
# (clients, mask) of cohorts of 2 out of 6 clients: 0 and 5 never train (0 is masked in
# round 2), 2 and 3 only from rounds 2 and 3; the last round is fully masked (no change).
UNTRAINED_ROUNDS = [(np.array([4, 1]), np.array([True, True])),
                    (np.array([2, 0]), np.array([True, False])),
                    (np.array([3, 4]), np.array([True, True])),
                    (np.array([5, 0]), np.array([False, False]))]
KEY = jax.random.key(3)
SHARDED_ROUNDS, SHARDED_DEVICES = 3, 2


def hparams(**options):
  """test_nn_reference's hparams with weight decay DECAY and the given options."""
  return hparams_lib.hparams(lr=0.1, momentum=0.5, weight_decay=DECAY, **options)


def make(name, **structure):
  """The algorithm `name` with test_nn_reference's STRUCTURE and cohort 4, or `structure`."""
  return nn_algorithms.make_algorithm(name, model=MODEL, **{"cohort": 4, **STRUCTURE, **structure})


def initial(algorithm, data, hp):
  """test_nn_reference's `initial_state` (personal params perturbed apart) with `init`'s
  untrained mask under hparams `hp` (None without the option average_untrained)."""
  untrained = algorithm.init(jax.random.key(0), data, hp).untrained
  return initial_state(algorithm, data).replace(untrained=untrained)


_JITTED = {}


def package_rounds(algorithm, state, data, hp, rounds):
  """[(state, train_loss) after each of `rounds`]: jitted masked_round with keys
  fold_in(KEY, t) (one jit per algorithm: compiled once per hparams structure)."""
  if algorithm not in _JITTED:
    _JITTED[algorithm] = jax.jit(algorithm.masked_round)
  out = []
  for t, (clients, mask) in enumerate(rounds):
    state, metrics = _JITTED[algorithm](state, jax.random.fold_in(KEY, t), data, hp,
                                        jnp.asarray(clients), jnp.asarray(mask))
    out.append((state, float(metrics["train_loss"])))
  return out


def reference_rounds(name, state, data, hp, rounds, *, average_untrained=False,
                     **conventions):
  """[(shared, personal, untrained [n] or None, train_loss) after each of `rounds`] of
  nn_reference from the package state `state`: `ref.masked_round` (conventions: its
  bias_decay and uniform), then with average_untrained `ref.start_untrained` (every client
  untrained at first)."""
  shared, personal = to_reference(state, data.num_clients)
  untrained = np.ones(data.num_clients, bool) if average_untrained else None
  out = []
  for t, (clients, mask) in enumerate(rounds):
    shared, personal, loss = ref.masked_round(
        name, shared, personal, jax.random.fold_in(KEY, t), data, hp, clients, mask,
        local_epochs=STRUCTURE["local_epochs"], head_epochs=STRUCTURE["head_epochs"],
        batch_size=STRUCTURE["batch_size"], **conventions)
    if average_untrained:
      personal, untrained = ref.start_untrained(personal, untrained, data, clients, mask,
                                                uniform=conventions.get("uniform", False))
    out.append((shared, personal, untrained, loss))
  return out


def assert_rounds_match(package, reference):
  """Each round's params, train_loss and untrained mask of `package_rounds` equal the
  reference's (`reference_rounds`, `flute_rounds`)."""
  for t, ((state, loss), (shared, personal, untrained, ref_loss)) in enumerate(
      zip(package, reference, strict=True)):
    assert_states_close(state, shared, personal)
    np.testing.assert_allclose(loss, ref_loss, rtol=RTOL, atol=ATOL, err_msg=f"round {t}")
    if untrained is None:
      assert state.untrained is None
    else:
      np.testing.assert_array_equal(state.untrained, untrained, err_msg=f"round {t}")


def differ(a, b) -> bool:
  """Whether the pytrees a and b (of the same structure) differ beyond RTOL, ATOL."""
  return not all(np.allclose(u, v, rtol=RTOL, atol=ATOL)
                 for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def final(reference):
  """(shared, personal, train_losses) of `reference_rounds`' output."""
  return reference[-1][0], reference[-1][1], [r[3] for r in reference]


# -- no_bias_decay, uniform_average --------------------------------------------------------
@pytest.mark.parametrize("name", ["fedrep", "fedper"])
def test_no_bias_decay_matches_the_reference(name):
  data = make_data()
  algorithm, hp = make(name), hparams(no_bias_decay=1.0)
  state = initial(algorithm, data, hp)
  expected = reference_rounds(name, state, data, hp, ROUNDS, bias_decay=False)
  assert_rounds_match(package_rounds(algorithm, state, data, hp, ROUNDS), expected)
  decayed = reference_rounds(name, state, data, hp, ROUNDS)
  biases = lambda result: {p: v for p, v in result[-1][0].items() if p.endswith("/bias")}
  assert differ(biases(expected), biases(decayed))


@pytest.mark.parametrize("name", ["fedrep", "fedavg"])
def test_uniform_average_matches_the_reference(name):
  data = make_data()
  for clients, mask in ROUNDS:  # unequal counts: uniform and count weights differ
    assert len({int(data.counts[i]) for i in clients[mask]}) > 1
  algorithm, hp = make(name), hparams(uniform_average=1.0)
  state = initial(algorithm, data, hp)
  expected = reference_rounds(name, state, data, hp, ROUNDS, uniform=True)
  assert_rounds_match(package_rounds(algorithm, state, data, hp, ROUNDS), expected)
  weighted = reference_rounds(name, state, data, hp, ROUNDS)
  shared, _, losses = final(expected)
  other_shared, _, other_losses = final(weighted)
  assert differ(shared, other_shared)
  assert differ(losses[0], other_losses[0])  # the first round's loss: from the same params


# -- average_untrained -----------------------------------------------------------------------
@pytest.mark.parametrize("name,uniform", [("fedrep", False), ("lg-fedavg", False),
                                          ("fedrep", True)])
def test_average_untrained_matches_the_reference(name, uniform):
  data = make_data()
  algorithm = make(name)
  hp = hparams(average_untrained=1.0, **({"uniform_average": 1.0} if uniform else {}))
  state = initial(algorithm, data, hp)
  np.testing.assert_array_equal(state.untrained, np.ones(data.num_clients, bool))
  package = package_rounds(algorithm, state, data, hp, UNTRAINED_ROUNDS)
  expected = reference_rounds(name, state, data, hp, UNTRAINED_ROUNDS, average_untrained=True,
                              uniform=uniform)
  assert_rounds_match(package, expected)
  _, start = to_reference(state, data.num_clients)
  after_one, untrained = package[0][0], expected[0][2]
  np.testing.assert_array_equal(np.flatnonzero(untrained), [0, 2, 3, 5])
  for i in np.flatnonzero(untrained):  # they took the cohort's mean, not their own params
    assert differ(jax.tree.map(lambda v: v[i], after_one.personal), start[i])
  assert np.flatnonzero(package[-1][0].untrained).tolist() == [0, 5]


def test_options_at_zero_are_the_papers_conventions():
  """Every flag present and 0: the paper's numbers (the untrained mask kept, unused)."""
  data = make_data()
  algorithm = make("fedrep")
  hp = hparams(**{flag: 0.0 for flag in AUTHORS})
  state = initial(algorithm, data, hp)
  package = package_rounds(algorithm, state, data, hp, UNTRAINED_ROUNDS)
  expected = reference_rounds("fedrep", state, data, hp, UNTRAINED_ROUNDS)
  assert_rounds_match([(s.replace(untrained=None), loss) for s, loss in package], expected)
  np.testing.assert_array_equal(package[-1][0].untrained, [1, 0, 0, 0, 0, 1])


def test_the_papers_conventions_keep_no_untrained_mask():
  data = make_data()
  algorithm = make("fedrep")
  assert algorithm.init(jax.random.key(0), data, hparams()).untrained is None
  untrained = algorithm.init(jax.random.key(0), data, hparams(average_untrained=1.0)).untrained
  assert untrained.dtype == jnp.bool_ and untrained.tolist() == [True] * data.num_clients


# -- the family program ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fedrep", "local"])
def test_a_family_member_with_the_authors_conventions_is_its_own_algorithm(name):
  """FedRep run by the shared program (peers fedper and local) with every flag gives
  FedRep's numbers with them; local only (which shares nothing) those of Local with the
  others (Local refuses average_untrained: for it, the family's averaging is a no-op)."""
  data = make_data()
  hp = hparams(**AUTHORS)
  peers = [make(n) for n in ("fedrep", "fedper", "local")]
  algorithm = peers[0] if name == "fedrep" else peers[2]
  program, member_hp = nn_program.program(algorithm, hp, peers, data.x[0, 0])
  assert isinstance(program, partial.PartialSharing)
  own_hp = hp if name == "fedrep" else hparams(
      **{k: v for k, v in AUTHORS.items() if k != "average_untrained"})
  own_state = initial(algorithm, data, own_hp)
  state = program.init(jax.random.key(0), data, member_hp)
  state = state.replace(personal={**state.personal, **own_state.personal})
  own = package_rounds(algorithm, own_state, data, own_hp, UNTRAINED_ROUNDS)
  run = package_rounds(program, state, data, member_hp, UNTRAINED_ROUNDS)
  for (own_after, own_loss), (after, loss) in zip(own, run, strict=True):
    np.testing.assert_allclose(loss, own_loss, rtol=RTOL, atol=ATOL)
    chex.assert_trees_all_close(
        ({p: after.shared[p] for p in own_after.shared},
         {p: after.personal[p] for p in own_after.personal}),
        (own_after.shared, own_after.personal), rtol=RTOL, atol=ATOL)
    if name == "fedrep":
      np.testing.assert_array_equal(after.untrained, own_after.untrained)
  if name == "fedrep":  # its never-trained clients 0 and 5 took the cohort's mean head
    start = initial(algorithm, data, hp).personal
    for i in (0, 5):
      assert differ({p: run[-1][0].personal[p][i] for p in start},
                    {p: v[i] for p, v in start.items()})


# -- FLUTE ---------------------------------------------------------------------------------
FLUTE_CASES = {  # case: (head_epochs, head_first, hparams options)
    "feature_sum": (0, False, dict(feature_sum=1.0)),
    "head_first": (2, True, {}),
    "authors": (2, True, AUTHORS)}


def flute_rounds(state, data, hp, rounds, *, head_epochs, head_first=False, feature_sum=False,
                 bias_decay=True, uniform=False, average_untrained=False):
  """`reference_rounds` of FLUTE (flute_reference, test_flute_neural's lambdas):
  `fref.untrained_round` from every client untrained with average_untrained, else
  `fref.masked_round`."""
  shared, personal = to_reference(state, data.num_clients)
  untrained = np.ones(data.num_clients, bool) if average_untrained else None
  lambdas = flute_tests.LAMBDAS
  structure = dict(server_lr=lambdas["flute_server_lr"], uniform=uniform,
                   local_epochs=flute_tests.STRUCTURE["local_epochs"], head_epochs=head_epochs,
                   batch_size=flute_tests.STRUCTURE["batch_size"], bias_decay=bias_decay,
                   head_first=head_first, feature_sum=feature_sum,
                   feature_norm=lambdas["flute_feature_norm"], nc=lambdas["flute_nc"],
                   head_norm=lambdas["flute_head_norm"])
  out = []
  for t, (clients, mask) in enumerate(rounds):
    key = jax.random.fold_in(KEY, t)
    if average_untrained:
      shared, personal, untrained, loss = fref.untrained_round(
          shared, personal, untrained, key, data, hp, clients, mask, **structure)
    else:
      shared, personal, loss = fref.masked_round(shared, personal, key, data, hp, clients,
                                                 mask, **structure)
    out.append((shared, personal, untrained, loss))
  return out


@pytest.mark.parametrize("case", list(FLUTE_CASES))
def test_flute_conventions_match_the_reference(case):
  head_epochs, head_first, options = FLUTE_CASES[case]
  data = flute_tests.make_data()
  algorithm = flute_tests.make(head_epochs=head_epochs, head_first=head_first)
  hp = hparams(**options, **flute_tests.LAMBDAS)
  state = initial(algorithm, data, hp)
  authors = dict(head_first=head_first, feature_sum="feature_sum" in options,
                 bias_decay="no_bias_decay" not in options, uniform="uniform_average" in options,
                 average_untrained="average_untrained" in options)
  rounds = UNTRAINED_ROUNDS[:3]
  expected = flute_rounds(state, data, hp, rounds, head_epochs=head_epochs, **authors)
  assert_rounds_match(package_rounds(algorithm, state, data, hp, rounds), expected)
  paper = flute_rounds(state, data, hp, rounds, head_epochs=head_epochs)
  assert differ(final(expected)[:2], final(paper)[:2])


def test_flute_star_head_first_carries_the_heads_momentum():
  """A client of FLUTE* with head_first: the reference's (the head's momentum carried into
  the joint epochs), not head epochs then joint epochs each from zero momentum."""
  data, i, key = flute_tests.make_data(), 3, jax.random.key(5)
  algorithm = flute_tests.make(head_epochs=2, head_first=True)
  body, head, loss = flute_tests.client_update(algorithm, data, i, key)
  shared, personal = to_reference(initial_state(algorithm, data), data.num_clients)
  params = {**shared, **personal[i]}
  x, y, count = np.asarray(data.x[i], np.float64), np.asarray(data.y[i]), int(data.counts[i])
  lambdas = {name: flute_tests.LAMBDAS["flute_" + name]
             for name in ("feature_norm", "head_norm", "nc")}
  carried, ref_loss = fref.client_update(params, x, y, count, key, flute_tests.HP,
                                         local_epochs=1, head_epochs=2, batch_size=4,
                                         head_first=True, **lambdas)
  chex.assert_trees_all_close(({**body, **head}, loss), (carried, ref_loss), rtol=RTOL,
                              atol=ATOL)
  classes = fref.class_mask(y, count, 10)
  grad_fn = lambda p, xb, yb: fref.flute_loss_and_grads(p, xb, yb, classes, **lambdas)
  key_joint, key_head = jax.random.split(key)
  fresh, _ = ref.sgd(params, ref.head_names(params), grad_fn, x, y, count, key_head,
                     flute_tests.HP, 2, 4)
  fresh, _ = ref.sgd(fresh, list(fresh), grad_fn, x, y, count, key_joint, flute_tests.HP, 1, 4)
  assert differ(carried, fresh)


# -- bad options -----------------------------------------------------------------------------
@pytest.mark.parametrize("flag", list(AUTHORS))
def test_a_convention_flag_must_be_0_or_1(flag):
  with pytest.raises(ValueError, match=f"{flag}=0.5 is out of range: {flag} must be 0 or 1"):
    hparams_lib.hparams(**{flag: 0.5})


@pytest.mark.parametrize("name", ["ditto", "fedavg", "local"])
def test_average_untrained_is_refused_where_it_does_not_apply(name, compiles):
  data, key = make_data(), jax.random.key(0)
  algorithm, hp = make(name), hparams(average_untrained=1.0)
  with pytest.raises(ValueError, match=f"{name}: the option average_untrained"):
    algorithm.check(data, hp)
  compiles.reset()  # building the data and the key may compile; only the run must not
  with pytest.raises(ValueError, match=f"{name}: the option average_untrained"):
    fr.run(algorithm, data, hp, key, 1, progress=False)
  assert compiles.count == 0


# -- sharded -------------------------------------------------------------------------------
SHARDED_HP = hparams(average_untrained=1.0, uniform_average=1.0)


def sharded_outcome(devices) -> dict:
  """{name: numpy array} of a SHARDED_ROUNDS-round `fr.run` of FedRep with average_untrained
  and uniform_average, cohort 2 drawn over 2 cohort groups of make_data's 6 clients, its
  client axis over `devices` devices (None: unsharded): train_loss, the final evaluation's
  metrics, shared and personal params and the untrained mask."""
  data = make_data()
  algorithm = make("fedrep", cohort=2, cohort_groups=2, devices=devices)
  if devices is not None:
    data = sharding.shard_clients(data, sharding.client_mesh(devices))
  result = fr.run(algorithm, data, SHARDED_HP, jax.random.key(0), SHARDED_ROUNDS,
                  progress=False)
  state = jax.device_get(result.state)
  return {"train_loss": result.metrics["train_loss"], "untrained": state.untrained,
          **result.eval_metrics, **{"shared/" + k: v for k, v in state.shared.items()},
          **{"personal/" + k: v for k, v in state.personal.items()}}


@pytest.mark.slow  # a child process; the fast tier keeps test_nn_sharding's sharded rounds
def test_sharded_average_untrained_equals_unsharded(tmp_path):
  """The sharded run's numbers (2 devices, a child process) are the unsharded run's; some of
  its clients never trained and took the cohorts' mean heads."""
  out = str(tmp_path / "sharded.npz")
  with open(tmp_path / "child.log", "w") as log:
    child = subprocess.Popen([sys.executable, __file__, out],
                             env=emulated_devices_env(SHARDED_DEVICES), stdout=log,
                             stderr=subprocess.STDOUT)
    try:
      expected = sharded_outcome(None)  # while the child runs
      returncode = child.wait(timeout=300)
    finally:
      if child.poll() is None:
        child.kill()
        child.wait()
  assert returncode == 0, (tmp_path / "child.log").read_text()[-4000:]
  with np.load(out) as npz:
    chex.assert_trees_all_close(dict(npz), expected, rtol=2e-4, atol=1e-6)
  untrained = expected["untrained"]
  assert 0 < untrained.sum() < len(untrained)  # some clients trained, some did not
  start = fr.init_state(make("fedrep", cohort=2, cohort_groups=2), make_data(), SHARDED_HP,
                        jax.random.key(0))
  for path, leaf in start.personal.items():  # the untrained clients took the cohort's mean
    assert differ(expected["personal/" + path][untrained], np.asarray(leaf)[untrained])


if __name__ == "__main__":  # the child of the sharded test: where to write its outcome
  np.savez(sys.argv[1], **sharded_outcome(SHARDED_DEVICES))


def test_other_convention_values_and_seeds_do_not_recompile(compiles):
  """The flags are traced: FLUTE* with the authors' flags, run again with other values of
  them (0 or 1) and another key, compiles nothing new."""
  data = make_data()
  algorithm = make("flute-star", cohort=2, head_first=True)
  fr.run(algorithm, data, hparams(**AUTHORS), jax.random.key(0), 2, progress=False)
  assert compiles.count > 0
  compiles.reset()
  others = dict(AUTHORS, feature_sum=0.0, no_bias_decay=0.0)
  fr.run(algorithm, data, hparams(**others), jax.random.key(1), 2, progress=False)
  assert compiles.count == 0
