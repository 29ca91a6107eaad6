"""Sweeps with --grid / grid=: every combination runs, traced keys in one call per shape,
swept keys as columns, per-combination units and summaries, errors before any work."""

import csv
import dataclasses
import io
import json
import os

import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep import cli
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import plotting
from fedjax_rep.experiments import recipe_registry
from fedjax_rep.experiments import runner


@dataclasses.dataclass(frozen=True)
class TinyConfig(cfg.Config):
  lr: float = cfg.lr(0.1)
  size: int = cfg.positive_int("a shape", 1)
  sizes: tuple = cfg.positive_int("a list of shapes", (1, 2), sequence=True)
  rounds: int = cfg.rounds(2)


def tiny_rows(config, seeds, unit, lr):
  """Rows (algorithm a, seeds, rounds) whose `value` is computed from the configuration,
  through one unit per entry of config.sizes."""
  rows = []
  for n in config.sizes:
    values = unit(f"n{n}", lambda n=n: {"value": np.full(seeds, lr * config.size * n)})
    rows += [{"algorithm": "a", "seed": s, "round": t, "sizes": n, "value": float(v)}
             for s, v in enumerate(values["value"]) for t in range(1, config.rounds + 1)]
  return rows


class Calls:
  """The recipe's run: records each call's configuration and grid, returns tiny_rows."""

  def __init__(self):
    self.calls = []

  def __call__(self, config, seeds, batch, **kwargs):
    self.calls.append((config, kwargs.get("grid")))
    if "grid" not in kwargs:
      return tiny_rows(config, seeds, batch.unit, config.lr)
    return [{**row, "lr": combination["lr"]} for combination in kwargs["grid"]
            for row in tiny_rows(config, seeds, lambda name, compute: batch.unit(
                f"lr{combination['lr']}-{name}", compute), combination["lr"])]


def summarize(rows, config):
  return [{"algorithm": "a", "total": sum(r["value"] for r in rows), "size_seen": config.size}]


@pytest.fixture(params=[(), ("lr",)], ids=["plain", "traced"])
def tiny(request):
  """A registered fake recipe 'test-tiny', without or with lr traced; yields its run."""
  run = Calls()
  recipe_registry.register(recipe_registry.Recipe(
      name="test-tiny", summary="test", config=TinyConfig, quick={}, run=run,
      plot=lambda rows, config, f: f.write(b"png"), summarize=summarize,
      traced=request.param))
  yield run
  del recipe_registry.RECIPES["test-tiny"]


def test_every_combination_runs_with_its_columns(tiny):
  rows, config = fr.run_recipe("test-tiny", seeds=2, grid={"lr": [0.1, 0.3], "size": [1, 2]})
  traced = recipe_registry.get("test-tiny").traced
  # lr traced: one call per size with grid=[{lr: 0.1}, {lr: 0.3}]; else one per combination
  assert [(c.size, c.lr, g) for c, g in tiny.calls] == (
      [(1, 0.1, [{"lr": 0.1}, {"lr": 0.3}]), (2, 0.1, [{"lr": 0.1}, {"lr": 0.3}])] if traced
      else [(1, 0.1, None), (2, 0.1, None), (1, 0.3, None), (2, 0.3, None)])
  assert len(rows) == 4 * 2 * 2 * 2  # combinations x sizes x seeds x rounds
  for r in rows:
    assert r["grid"] == f"lr={r['lr']}, size={r['size']}"
    assert r["value"] == pytest.approx(r["lr"] * r["size"] * r["sizes"])
  assert config.sizes == (1, 2) and config.lr == 0.1  # the unswept configuration


def test_without_grid_nothing_changes(tiny):
  rows, _ = fr.run_recipe("test-tiny", seeds=2)
  assert tiny.calls == [(TinyConfig(), None)]
  assert rows == tiny_rows(TinyConfig(), 2, lambda name, compute: compute(), 0.1)


def test_traced_key_alone_is_one_call(tiny):
  rows, _ = fr.run_recipe("test-tiny", grid=["lr=0.1,0.2,0.4"])
  assert len(tiny.calls) == (1 if recipe_registry.get("test-tiny").traced else 3)
  assert sorted({r["grid"] for r in rows}) == ["lr=0.1", "lr=0.2", "lr=0.4"]


def test_a_sequence_field_sweeps_one_element_at_a_time(tiny):
  rows, config = fr.run_recipe("test-tiny", grid=["sizes=3,5"])
  assert [c.sizes for c, _ in tiny.calls] == [(3,), (5,)]
  assert {(r["sizes"], r["grid"]) for r in rows} == {(3, "sizes=3"), (5, "sizes=5")}
  assert config.sizes == (3, 5)  # the figure's configuration: every swept value


def test_run_to_dir_columns_units_summary_and_resume(tiny, tmp_path):
  out = str(tmp_path / "run")
  grid = ["lr=0.1,0.3", "size=1,2"]
  runner.run_to_dir("test-tiny", seeds=2, grid=grid, out=out, progress=False)
  with open(os.path.join(out, "metrics.csv")) as f:
    rows = list(csv.DictReader(f))
  assert list(rows[0])[:6] == ["algorithm", "seed", "round", "lr", "size", "grid"]
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["grid"] == {"lr": [0.1, 0.3], "size": [1, 2]}
  traced = recipe_registry.get("test-tiny").traced
  units = {f"{'' if traced else f'lr={lr},'}size={size}--"
           f"{f'lr{lr}-' if traced else ''}n{n}.npz"
           for lr in (0.1, 0.3) for size in (1, 2) for n in (1, 2)}
  assert set(os.listdir(os.path.join(out, "parts"))) == units
  with open(os.path.join(out, "summary.csv")) as f:
    table = list(csv.DictReader(f))
  assert [(t["algorithm"], t["lr"], t["size"], t["grid"], t["size_seen"]) for t in table] == [
      ("a", lr, size, f"lr={lr}, size={size}", size)
      for lr in ("0.1", "0.3") for size in ("1", "2")]
  for t in table:  # each combination's rows alone: sizes 1, 2 x 2 seeds x 2 rounds
    assert float(t["total"]) == pytest.approx(float(t["lr"]) * int(t["size"]) * 3 * 4)

  # Resume: every unit is on disk, nothing is computed again; another grid is refused.
  runner.run_to_dir("test-tiny", seeds=2, grid=grid, out=out, progress=False)
  with open(os.path.join(out, "metrics.csv")) as f:
    assert list(csv.DictReader(f)) == rows
  with pytest.raises(FileExistsError, match="different configuration, seeds or grid"):
    runner.run_to_dir("test-tiny", seeds=2, grid=["lr=0.1,0.3"], out=out, progress=False)


def test_without_grid_units_and_columns_are_unchanged(tiny, tmp_path):
  out = str(tmp_path / "run")
  runner.run_to_dir("test-tiny", seeds=1, out=out, progress=False)
  assert sorted(os.listdir(os.path.join(out, "parts"))) == ["n1.npz", "n2.npz"]
  with open(os.path.join(out, "metrics.csv")) as f:
    assert next(csv.reader(f)) == ["algorithm", "seed", "round", "sizes", "value"]
  with open(os.path.join(out, "config.json")) as f:
    stored = json.load(f)
  del stored["grid"]  # a run directory from before --grid: resumed all the same
  with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(stored, f)
  runner.run_to_dir("test-tiny", seeds=1, out=out, progress=False)


def test_traced_rows_must_carry_their_values(tiny):
  if not recipe_registry.get("test-tiny").traced:
    pytest.skip("only a traced run returns the traced keys")
  recipe_registry.RECIPES["test-tiny"] = dataclasses.replace(
      recipe_registry.get("test-tiny"), run=lambda config, seeds, batch, grid: [
          {"algorithm": "a", "seed": 0, "round": 1, "lr": np.float32(g["lr"]) * 2}
          for g in grid])
  with pytest.raises(RuntimeError, match="returned a row of lr=0.2.*traced keys lr"):
    fr.run_recipe("test-tiny", grid={"lr": [0.1]})


def test_traced_keys_must_be_scalar_numbers():
  for traced in (("sizes",), ("learning_rate",)):
    with pytest.raises(ValueError, match=f"traced key '{traced[0]}' is not a number field"):
      recipe_registry.register(recipe_registry.Recipe(
          name="test-bad", summary="", config=TinyConfig, quick={}, run=None, plot=None,
          traced=traced))
  assert "test-bad" not in recipe_registry.RECIPES


@pytest.mark.parametrize("overrides,grid,pattern", [
    ((), ["learning_rate=0.1,0.2"],
     r"--grid: unknown configuration key 'learning_rate'; valid keys: num_clients"),
    ((), ["lr=0.1,fast"], r"--grid lr=0.1,fast: 'fast' is not valid; lr must be a number in "
                          r"\(0, inf\)"),
    ((), ["num_clients=10,x"], r"'x' is not valid; num_clients must be an integer in \[1"),
    ((), ["lr=0.1,-1"], r"--grid combination lr=-1.0: lr=-1.0 is out of range: lr must be a "
                        r"number in \(0, inf\)"),
    ((), ["rep_dim=2,11"], r"--grid combination rep_dim=11: rep_dim=11 is out of range.*"
                           r"\[1, dim=10\]"),
    ((), ["lr"], r"--grid expects KEY=VALUE, got 'lr'"),
    ((), ["lr="], r"--grid lr=: give one or more distinct values of lr, each a number"),
    ((), ["lr=0.1,0.1"], r"give one or more distinct values of lr"),
    ((), ["lr=0.1", "lr=0.2"], r"lr is given twice in --grid; give all its values once, as "
                               r"--grid lr=V1,V2,... \(each a number in \(0, inf\)\)"),
    (["lr=0.2"], ["lr=0.1,0.3"], r"lr is given in both --set and --grid"),
    ((), {"lr": [0.1, "x"]}, r"lr='x' is out of range"),
])
def test_bad_grids_fail_before_any_compilation(overrides, grid, pattern, compiles):
  with pytest.raises(fr.ConfigError, match=pattern):
    fr.run_recipe("fedrep-fig3", overrides=overrides, grid=grid)
  assert compiles.count == 0


def test_cli_reports_bad_grid_and_exits_2(capsys, tmp_path, compiles):
  assert cli.main(["run", "fedrep-fig3", "--grid", "lr=0.1,0", "--out", str(tmp_path)]) == 2
  assert "lr=0.0 is out of range" in capsys.readouterr().err
  assert compiles.count == 0 and not os.listdir(tmp_path)


def test_line_draws_one_line_per_combination_and_save_moves_legends_below():
  rows = [{"algorithm": "a", "seed": s, "round": t, "y": float(t + s), "grid": g}
          for g in ("lr=0.1", "lr=0.3") for s in (0, 1) for t in (1, 2, 3)]
  fig, (ax,) = plotting.figure(1)
  plotting.line(ax, rows, "round", "y", "A")
  assert ax.get_legend_handles_labels()[1] == ["A (lr=0.1)", "A (lr=0.3)"]
  fixed = plotting.figure(1)[1][0]  # keys fixed by the line's filter are left out
  plotting.line(fixed, [{**r, "grid": f"lr=0.1, n={r['seed']}", "n": r["seed"]} for r in rows],
                "round", "y", "A", n=1)
  assert fixed.get_legend_handles_labels()[1] == ["A (lr=0.1)"]
  first, second = ax.get_lines()
  assert first.get_color() != second.get_color() and first.get_ls() != second.get_ls()
  np.testing.assert_allclose(first.get_ydata(), [1.5, 2.5, 3.5])  # mean over seeds
  ax.legend()
  height = fig.get_figheight()
  plotting.save(fig, io.BytesIO())
  assert ax.get_legend() is None and len(fig.legends) == 1 and fig.get_figheight() > height
  plain_fig, (plain,) = plotting.figure(1)
  plotting.line(plain, [{k: v for k, v in r.items() if k != "grid"} for r in rows],
                "round", "y", "A")
  plotting.save(plain_fig, io.BytesIO())
  assert plain.get_legend_handles_labels()[1] == ["A"]  # without a grid: one line, and
  assert plain.get_legend() is None and len(plain_fig.legends) == 1  # the same legend below


def test_cli_grid_rows_equal_single_runs(tmp_path):
  """fedrep-fig3 over noise_std: each combination's rows are those of a run with --set."""
  out = str(tmp_path / "grid")
  settings = ["num_clients=10", "rounds=5"]
  assert cli.main(["run", "fedrep-fig3", "--quick", "--seeds", "2", "--no-progress",
                   "--set", settings[0], "--set", settings[1],
                   "--grid", "noise_std=0.01,0.1", "--out", out]) == 0
  with open(os.path.join(out, "metrics.csv")) as f:
    rows = list(csv.DictReader(f))
  assert list(rows[0])[3:5] == ["noise_std", "grid"]
  for value in ("0.01", "0.1"):
    single, _ = fr.run_recipe("fedrep-fig3", quick=True, seeds=2, progress=False,
                              overrides=settings + [f"noise_std={value}"])
    swept = [r for r in rows if r["noise_std"] == value]
    assert {r["grid"] for r in swept} == {f"noise_std={value}"} and len(swept) == len(single)
    for got, want in zip(swept, single):
      assert set(got) - {"noise_std", "grid"} == set(want)
      assert got["algorithm"] == want["algorithm"]
      np.testing.assert_allclose([float(got[k]) for k in want if k != "algorithm"],
                                 [float(want[k]) for k in want if k != "algorithm"], rtol=1e-5)
