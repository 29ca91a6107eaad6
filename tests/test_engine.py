"""The round engine: cohorts, no recompiles, determinism, chunking and resuming."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr


def small_problem(n=20):
  problem = fr.make_problem(jax.random.key(0), n, 8, 2, 0.05)
  return fr.make_fixed_data(jax.random.key(1), problem, 6)


HP = fr.LinearHparams(lr=jnp.float32(0.1), head_lr=jnp.float32(0.1))


@pytest.mark.parametrize("n,r,size", [(10, 0.1, 1), (100, 0.1, 10), (7, 0.5, 4), (3, 0.01, 1),
                                      (50, 1.0, 50)])
def test_cohort_size(n, r, size):
  assert fr.cohort_size(n, r) == size


def test_cohorts_are_distinct_uniform_and_fixed_size():
  keys = jax.random.split(jax.random.key(0), 4000)
  cohorts = np.asarray(jax.vmap(lambda k: fr.sample_cohort(k, 10, 3))(keys))
  assert cohorts.shape == (4000, 3)
  assert all(len(set(c)) == 3 for c in cohorts)
  counts = np.bincount(cohorts.ravel(), minlength=10) / 4000
  np.testing.assert_allclose(counts, 0.3, atol=0.03)
  np.testing.assert_array_equal(fr.sample_cohort(keys[0], 10, 10), np.arange(10))


def test_no_recompile_across_chunks_and_calls(compiles):
  data = small_problem()
  algorithm = fr.FedRep(rep_dim=2, cohort=5)
  fr.run(algorithm, data, HP, jax.random.key(0), 12, chunk=4, progress=False)
  first = compiles.count
  assert first > 0
  data2 = small_problem().replace(y=data.y + 1.0)  # new data, same shapes
  hparams2 = HP.replace(lr=jnp.float32(0.2))
  keys = [jax.random.key(1), jax.random.key(2)]
  compiles.reset()
  fr.run(algorithm, data, HP, keys[0], 12, chunk=4, progress=False)  # new seed
  fr.run(algorithm, data2, hparams2, keys[1], 12, chunk=4, progress=False)
  assert compiles.count == 0


def test_rounds_not_a_multiple_of_the_chunk_do_not_recompile(compiles):
  data = small_problem()
  algorithm = fr.FedRep(rep_dim=2, cohort=5)
  fr.run(algorithm, data, HP, jax.random.key(0), 12, chunk=5, progress=False)
  compiles.reset()
  result = fr.run(algorithm, data, HP, jax.random.key(0), 13, chunk=5, progress=False)
  assert compiles.count == 0
  assert result.metrics["train_loss"].shape == (13,)
  assert np.all(np.isfinite(result.metrics["train_loss"]))


def test_same_seed_same_numbers_and_chunking_does_not_matter():
  data = small_problem()
  algorithm = fr.FedRep(rep_dim=2, cohort=5)
  a = fr.run(algorithm, data, HP, jax.random.key(3), 10, chunk=10, progress=False)
  b = fr.run(algorithm, data, HP, jax.random.key(3), 10, chunk=10, progress=False)
  c = fr.run(algorithm, data, HP, jax.random.key(3), 10, chunk=3, progress=False)
  for name in a.metrics:
    np.testing.assert_array_equal(a.metrics[name], b.metrics[name])
    np.testing.assert_allclose(a.metrics[name], c.metrics[name], rtol=1e-6, atol=1e-7)
  d = fr.run(algorithm, data, HP, jax.random.key(4), 10, progress=False)
  assert not np.allclose(a.metrics["train_loss"], d.metrics["train_loss"])


def test_resume_from_a_saved_state_gives_the_same_run():
  data = small_problem()
  algorithm = fr.FedRep(rep_dim=2, cohort=5)
  whole = fr.run(algorithm, data, HP, jax.random.key(3), 10, progress=False)
  first = fr.run(algorithm, data, HP, jax.random.key(3), 4, progress=False)
  rest = fr.run(algorithm, data, HP, jax.random.key(3), 10, state=first.state, start_round=4,
                progress=False)
  np.testing.assert_allclose(rest.state.B, whole.state.B, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(
      np.concatenate([first.metrics["train_loss"], rest.metrics["train_loss"]]),
      whole.metrics["train_loss"], rtol=1e-6)


def test_run_rejects_bad_rounds_before_compiling(compiles):
  data, key, algorithm = small_problem(), jax.random.key(0), fr.FedRep(rep_dim=2, cohort=5)
  compiles.reset()
  with pytest.raises(ValueError, match="num_rounds"):
    fr.run(algorithm, data, HP, key, 0, progress=False)
  with pytest.raises(ValueError, match=r"start_round must be in \[0, num_rounds=5\)"):
    fr.run(algorithm, data, HP, key, 5, start_round=5, progress=False)
  assert compiles.count == 0


def test_client_data_checks_shapes():
  with pytest.raises(ValueError, match=r"X \[clients, samples, dim\]"):
    fr.client_data(np.zeros((3, 4)), np.zeros(3))
  data = fr.client_data(np.zeros((3, 4, 5)), np.zeros((3, 4)), B_star=np.eye(5)[:, :2])
  assert data.num_clients == 3 and data.dim == 5


def test_resume_carries_the_diverged_flags():
  data = small_problem()
  algorithm = fr.FedRep(rep_dim=2, cohort=5)
  hp = fr.LinearHparams(lr=jnp.float32(1e30), head_lr=jnp.float32(0.1))  # diverges at once
  first = fr.run(algorithm, data, hp, jax.random.key(3), 4, progress=False)
  assert bool(first.diverged) and first.metrics["diverged"][-1] == 1
  rest = fr.run(algorithm, data, HP, jax.random.key(3), 8, state=first.state, start_round=4,
                diverged=first.diverged, progress=False)
  assert np.all(rest.metrics["diverged"] == 1) and np.all(np.isnan(rest.metrics["train_loss"]))
  np.testing.assert_array_equal(rest.state.B, first.state.B)  # a diverged run stays put


def test_a_state_passed_in_stays_valid_although_chunks_donate_theirs():
  data = small_problem()
  algorithm = fr.FedRep(rep_dim=2, cohort=5)
  state = fr.init_state(algorithm, data, HP, jax.random.key(3))
  B0 = np.asarray(state.B)
  fr.run(algorithm, data, HP, jax.random.key(3), 6, chunk=2, state=state, progress=False)
  np.testing.assert_array_equal(state.B, B0)  # still readable, unchanged
