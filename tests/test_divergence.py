"""Divergence: the loop's blow-up bound, carried when a run resumes, and how figures show
diverged runs."""

import dataclasses
import io
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep.core import loop
from fedjax_rep.experiments import plotting


@dataclasses.dataclass(frozen=True)
class Swing:
  """A toy algorithm whose loss the test sets round by round: state (x [], t []) from
  (1, 0); round t multiplies x by hparams[t % 2] (hparams [2]) and reports it as train_loss."""
  name: str = "swing"
  quick_compile: ClassVar[bool] = False
  tracked_metric: ClassVar[str | None] = None

  def init(self, key, data, hparams):
    del key, data, hparams
    return jnp.float32(1.0), jnp.int32(0)

  def round(self, state, key, data, hparams):
    del key, data
    x, t = state
    x = x * hparams[t % 2]
    return (x, t + 1), {"train_loss": x}


# Two runs, swept: one grows 10x a round (never non-finite in 10 rounds), one swings
# between its first loss 1/500 and 500 times it.
RATES = jnp.array([[10.0, 10.0], [1 / 500, 500.0]], jnp.float32)
SWEEP = (None, 0, None)


def swing_run(num_rounds, **kwargs):
  return fr.run(Swing(), None, RATES, jax.random.key(0), num_rounds, sweep_axes=SWEEP,
                chunk=2, progress=False, **kwargs)


def test_the_bound_flags_a_blow_up_not_a_swing_and_changes_without_a_recompile(compiles):
  result = swing_run(8)
  # Losses 10, ..., 1e4 = 1e3 x the first (not above the bound), then 1e5 (above): the run
  # diverges at round 5, keeps the state before it and reports NaN from then on.
  np.testing.assert_array_equal(result.metrics["diverged"][0], [0, 0, 0, 0, 1, 1, 1, 1])
  np.testing.assert_allclose(result.metrics["train_loss"][0, :4], [10, 100, 1e3, 1e4])
  assert np.isnan(result.metrics["train_loss"][0, 4:]).all()
  assert float(result.state[0][0]) == 1e4 and bool(result.diverged[0])
  np.testing.assert_allclose(result.reference, [10, 1 / 500])
  assert not result.metrics["diverged"][1].any()  # a swing of 500x its first loss goes on
  assert np.isfinite(result.metrics["train_loss"][1]).all()
  compiles.reset()  # the factor is traced: switching it off or tightening it compiles nothing
  unbounded, tight = swing_run(8, blowup=None), swing_run(8, blowup=100.0)
  assert compiles.count == 0
  assert not unbounded.metrics["diverged"].any()
  assert np.isfinite(unbounded.metrics["train_loss"]).all()
  np.testing.assert_array_equal(tight.metrics["diverged"][1], [0, 1, 1, 1, 1, 1, 1, 1])


@dataclasses.dataclass(frozen=True)
class EvaluatedSwing(Swing):
  """Swing with an evaluation that reports the state's x as test_accuracy."""
  name: str = "evaluated-swing"

  def evaluate(self, state, data, hparams):
    del data, hparams
    return {"test_accuracy": state[0]}


def test_a_diverged_run_is_evaluated_as_nan_from_its_diverged_round_on():
  """Run 0 diverges at round 5 and keeps its state of round 4 (x = 1e4): its evaluations
  after rounds 6 and 8 are NaN, not that kept state's; run 1 never diverges and is
  evaluated as before. Evaluations of a sweep where no run diverged are left as they are."""
  result = fr.run(EvaluatedSwing(), None, RATES, jax.random.key(0), 8, sweep_axes=SWEEP,
                  chunk=2, eval_every=2, progress=False)
  np.testing.assert_array_equal(result.eval_rounds, [2, 4, 6, 8])
  accuracy = result.eval_metrics["test_accuracy"]
  np.testing.assert_allclose(accuracy[0, :2], [100, 1e4])
  assert np.isnan(accuracy[0, 2:]).all() and float(result.state[0][0]) == 1e4
  np.testing.assert_allclose(accuracy[1], [1, 1, 1, 1], rtol=1e-5)
  assert accuracy.dtype == np.float32
  unbounded = fr.run(EvaluatedSwing(), None, RATES, jax.random.key(0), 8, sweep_axes=SWEEP,
                     chunk=2, eval_every=2, progress=False, blowup=None)
  np.testing.assert_allclose(unbounded.eval_metrics["test_accuracy"][0], [100, 1e4, 1e6, 1e8],
                             rtol=1e-5)


def test_the_legend_counts_runs_not_panels():
  """digits-personalized's figure draws the same 3 runs (seed 2 diverged) in two panels
  (accuracy, loss): its legend says 1 of 3 seeds, where it said 2 of 6. Panels of different
  runs of the same seeds (one per setting, as fedrep-fig3's num_clients) count each:
  'runs'. A line where no run diverged is its bare label."""
  rows = [{"algorithm": a, "seed": seed, "round": t, "n": n,
           "diverged_round": 2 if (seed, n) == (2, 10) and a == "a" else 0,
           "loss": np.nan if (seed, n, t) == (2, 10, 2) and a == "a" else 1.0 + seed,
           "accuracy": 0.5} for a in "ab" for n in (10, 20) for seed in range(3)
          for t in (1, 2)]

  def legend(panels):
    fig, axes = plotting.figure(len(panels))
    for ax, (y, where) in zip(axes, panels):
      for a in "ab":
        plotting.line(ax, rows, "round", y, a.upper(), algorithm=a, **where)
    plotting.save(fig, io.BytesIO())
    return [t.get_text() for t in fig.legends[0].get_texts()]

  assert legend([("accuracy", {"n": 10}), ("loss", {"n": 10})]) == [
      "A (diverged at x: 1/3 seeds)", "B"]
  assert legend([("loss", {"n": 10}), ("loss", {"n": 20})]) == [
      "A (diverged at x: 1/6 runs)", "B"]
  assert legend([("loss", {"n": 20})]) == ["A", "B"]


def test_a_bad_factor_stops_the_run_before_it_compiles(compiles):
  jax.random.key(0)  # the run's key: making it compiles in a fresh process
  compiles.reset()
  with pytest.raises(ValueError, match=r"blowup must be a number > 0 or None, got 0"):
    swing_run(4, blowup=0)
  assert compiles.count == 0


def test_a_resumed_run_equals_an_uninterrupted_one_with_the_bound(compiles):
  whole = swing_run(10)
  compiles.reset()
  first = swing_run(3)
  rest = swing_run(10, state=first.state, start_round=3, diverged=first.diverged,
                   reference=first.reference)
  assert "jit(_run_chunk)" not in compiles.names  # (the copy of the state passed in compiles)
  for name in whole.metrics:
    np.testing.assert_array_equal(
        np.concatenate([first.metrics[name], rest.metrics[name]], axis=1), whole.metrics[name])
  for got, want in zip(rest.state, whole.state):
    np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(rest.reference, whole.reference)
  # Without the carried reference the resumed run measures from its own first round (1e4)
  # and misses the blow-up at round 5.
  fresh = swing_run(10, state=first.state, start_round=3, diverged=first.diverged)
  assert whole.metrics["diverged"][0, 4] and not fresh.metrics["diverged"][0, 1]


@jax.jit
def flute_problem(key):
  """App. C.1's problem with M = 9 clients, d = 6, k = 2, N = 8 (one program: eager steps
  would compile one by one)."""
  key_models, key_data = jax.random.split(key)
  models = fr.make_models(key_models, 9, 6, "linear")
  return fr.make_underparam_data(key_data, models, 2, 8, 0.3 ** 0.5)


def test_flute_is_flagged_before_its_model_error_explodes():
  """FLUTE with Algorithm 1's 1/N loss at eta = 0.3 blows up: with the bound (on the model
  error) it is flagged while its errors are within 1e3 x the first; without it, its error
  passes that before it becomes non-finite."""
  data = flute_problem(jax.random.key(2))
  lr = jnp.float32(0.3)
  hparams = fr.LinearHparams(lr=lr, head_lr=lr)
  runs = {blowup: fr.run(fr.Flute(rep_dim=2, loss="mean"), data, hparams, jax.random.key(0),
                         40, blowup=blowup, progress=False)
          for blowup in (loop.DEFAULT_BLOWUP, None)}
  errors = {blowup: run.metrics["model_error"] for blowup, run in runs.items()}
  first = {blowup: int(np.argmax(run.metrics["diverged"])) for blowup, run in runs.items()}
  assert 0 < first[loop.DEFAULT_BLOWUP] < first[None]
  bound = loop.DEFAULT_BLOWUP * errors[None][0]
  assert np.all(errors[loop.DEFAULT_BLOWUP][:first[loop.DEFAULT_BLOWUP]] <= bound)
  assert np.nanmax(errors[None]) > bound
  assert np.isnan(errors[loop.DEFAULT_BLOWUP][first[loop.DEFAULT_BLOWUP]:]).all()


def test_figures_take_y_limits_from_runs_that_did_not_diverge():
  """Seeds 0 and 1 stay in [1, 2]; seed 2 reaches 1e4 by round 4 and diverges at round 5.
  A panel with them all fits seeds 0 and 1 (mean line and band over them) and marks seed
  2 inside its limits; a panel of seed 2 alone fits its curve."""
  rows = [{"algorithm": "a", "seed": seed, "round": t, "diverged_round": 5 if seed == 2 else 0,
           "y": (10.0 ** t if t < 5 else np.nan) if seed == 2 else 1 + seed / t}
          for seed in range(3) for t in range(1, 9)]
  fig, axes = plotting.grid_of(3)
  assert len(axes) == 3 and len(fig.axes) == 3  # 2 x 2, the last cell left empty
  plotting.line(axes[0], rows, "round", "y", "A")
  plotting.line(axes[1], plotting.select(rows, seed=2), "round", "y", "A")
  axes[0].legend()
  fig.suptitle("a title longer than the figure is wide " * 4)
  plotting.save(fig, io.BytesIO())
  assert axes[0].get_legend_handles_labels()[1] == ["A (diverged at x: 1/3 seeds)"]
  # The figure's legend counts seed 2's run once, though both panels draw it.
  assert [t.get_text() for t in fig.legends[0].get_texts()] == ["A (diverged at x: 1/3 seeds)"]
  np.testing.assert_allclose(axes[0].get_lines()[0].get_ydata(), 1 + 0.5 / np.arange(1, 9))
  low, high = axes[0].get_ylim()
  assert 0.9 < low < 1 and 2 < high < 2.2
  (mark,) = [line for line in axes[0].get_lines() if line.get_gid() == plotting.DIVERGED_MARK]
  assert mark.get_xdata()[0] == 4 and low < mark.get_ydata()[0] < high
  assert axes[1].get_ylim()[1] >= 1e4  # no run left: the diverged curve sets the limits
  assert "\n" in fig.get_suptitle()


def test_a_panel_whose_runs_all_diverged_before_a_finite_value_says_so():
  """Every run NaN from its first round (as digits-personalized at lr=1e6): the panel says
  there is nothing to draw and has no ticks; a panel with a finite value has no such text."""
  rows = [{"algorithm": "a", "seed": seed, "round": t, "diverged_round": 1,
           "y": np.nan, "z": 1.0 + t} for seed in range(2) for t in (1, 2)]
  fig, axes = plotting.figure(2)
  plotting.line(axes[0], rows, "round", "y", "A")
  plotting.line(axes[1], rows, "round", "z", "A")
  plotting.save(fig, io.BytesIO())
  assert [t.get_text() for t in axes[0].texts] == [
      "nothing to draw:\nevery run diverged before a finite value"]
  assert not axes[0].yaxis.get_tick_params()["labelleft"]
  assert len(axes[1].texts) == 0


def test_each_diverged_run_is_named_by_its_algorithm_seed_setting_and_round():
  """fedrep-fig3's rows under --grid lr=0.1,1: num_clients is a setting column, lr is named
  by the grid label; one line per diverged run (its diverged round's row), none for a run
  that did not diverge."""
  from fedjax_rep.experiments import runner
  from fedjax_rep.recipes.kit import shared
  diverged = np.array([[0, 1, 1], [0, 0, 0]], np.float32)  # seed 3 at round 2; seed 4 never
  rows = [{**row, "grid": f"lr={lr}"}
          for lr in (0.1, 1.0) for row in shared.round_rows(
              "fedrep", [3, 4], {"principal_angle": np.ones((2, 3)), "diverged": diverged},
              num_clients=100, lr=lr)]
  assert runner.diverged_lines(rows) == [
      f"fedjax-rep: fedrep seed 3 (num_clients=100, grid lr={lr}) diverged at round 2; its "
      f"metrics are NaN from then on" for lr in (0.1, 1.0)]
  assert runner.diverged_lines([r for r in rows if r["seed"] == 4]) == []


@pytest.mark.slow
def test_the_issue_command_says_each_diverged_run_on_stderr_and_records_nan(tmp_path, capsys):
  """Issue 47: `fedjax-rep run digits-personalized --quick --set lr=1e6 --set rounds=5`
  diverges in every run at round 1. It exits 0; stderr has one line per run (6 algorithms x
  3 seeds) naming it and its round; every metric of metrics.csv from then on is NaN,
  evaluations included; summary.csv averages no diverged run and counts them."""
  import csv

  from fedjax_rep import cli
  out = tmp_path / "out"
  assert cli.main(["run", "digits-personalized", "--quick", "--set", "lr=1e6", "--set",
                   "rounds=5", "--no-progress", "--out", str(out)]) == 0
  captured = capsys.readouterr()
  algorithms = ["fedrep", "fedper", "lg-fedavg", "fedavg", "fedavg-ft", "local"]
  assert captured.err.splitlines() == [
      f"fedjax-rep: {a} seed {s} diverged at round 1; its metrics are NaN from then on"
      for a in algorithms for s in range(3)]
  with open(out / "metrics.csv") as f:
    rows = list(csv.DictReader(f))
  assert len(rows) == 6 * 3 * 5
  assert all(r["diverged"] == "1" and r["diverged_round"] == "1" for r in rows)
  evaluated = [r for r in rows if r["test_accuracy"]]
  assert len(evaluated) == 6 * 3 and all(r["round"] == "5" for r in evaluated)
  assert all(np.isnan(float(r[k])) for r in evaluated
             for k in ("train_loss", "test_accuracy", "test_accuracy_std"))
  with open(out / "summary.csv") as f:
    summary = list(csv.DictReader(f))
  assert [r["algorithm"] for r in summary] == algorithms
  assert all(r["diverged"] == "3" and r["seeds"] == "0" and np.isnan(float(r["test_accuracy"]))
             for r in summary)
  assert {r["statistic"] for r in summary} == {"no evaluation"}
  assert "nan" in captured.out  # the summary printed shows NaN, not an accuracy


def test_numbers_from_a_diverged_runs_final_state_are_nan():
  """fedrep-fig4's new-client errors and fedavg-ft-fig3's fine-tuning errors come from the
  final states: NaN for a run that diverged (seed 1), as they were for the others."""
  from fedjax_rep.recipes.kit import shared
  metrics = {"diverged": np.array([[0, 0, 0], [0, 1, 1]], np.float32)}
  errors = np.array([[0.1, 0.2], [0.3, 0.4]], np.float32)
  masked = shared.nan_where_diverged(errors, metrics)
  assert masked.dtype == np.float32
  np.testing.assert_array_equal(masked, [errors[0], [np.nan, np.nan]])
  np.testing.assert_array_equal(shared.nan_where_diverged(errors[:, 0], metrics),
                                [errors[0, 0], np.nan])
