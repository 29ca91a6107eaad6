"""Plugins: a user's file registers an algorithm that runs in a recipe (`run --plugin`),
with its declared option as a --set/--grid key; config.json records the file, whose
change refuses a resume; a broken file is a one-line error before anything compiles."""

import csv
import hashlib
import json
import re

import jax
import pytest

import fedjax_rep as fr
from fedjax_rep import cli
from fedjax_rep.core import registry as core_registry
from fedjax_rep.nn import algorithms as nn_algorithms
from fedjax_rep.recipes.kit import neural
from fedjax_rep.experiments import plotting
from fedjax_rep.experiments import plugins
from fedjax_rep.experiments import runner

PLUGIN = '''"""FedAvg whose server keeps a fraction server_beta of its model each round."""
import dataclasses

import jax

import fedjax_rep as fr


@dataclasses.dataclass(frozen=True)
class DampedFedAvg(fr.nn.fedavg.FedAvg):
  name: str = "damped-fedavg"
  options = (fr.Option("server_beta", 0.0, 0.0, 0.999,
                       help="the server keeps this fraction of its model each round"),)

  def client_update(self, shared, personal, x, y, count, key, hparams, info):
    new, personal, loss = super().client_update(shared, personal, x, y, count, key, hparams,
                                                info)
    beta = hparams.options.get("server_beta", 0.0)
    sent = jax.tree.map(lambda w, v: w + (1 - beta) * (v - w), shared, new)
    return sent, personal, loss


fr.register_algorithm("damped-fedavg", "FedAvg whose server keeps server_beta of its model",
                      DampedFedAvg, ft_epochs=0)
'''
NAME = "damped-fedavg"
SMALL = ["digits-personalized", "--quick", "--seeds", "1", "--no-progress",
         "--set", f"algorithms=fedrep,{NAME}", "--set", "rounds=4", "--set", "eval_every=2",
         "--set", "num_clients=10"]


@pytest.fixture(autouse=True)
def registry_restored():
  """Each test starts and ends with the package's algorithms only (no plugin loaded)."""
  neural_entries, classes = dict(core_registry.ALGORITHMS["neural"]), dict(nn_algorithms.CLASSES)
  yield
  for name in set(nn_algorithms.CLASSES) - set(classes):
    del core_registry.ALGORITHMS["neural"][name], nn_algorithms.CLASSES[name]
  assert core_registry.ALGORITHMS["neural"] == neural_entries
  plugins.LOADED.clear()


@pytest.fixture
def plugin(tmp_path):
  path = tmp_path / "damped.py"
  path.write_text(PLUGIN)
  return path


def one_error_line(capsys) -> str:
  """The CLI's stderr, which must be one line 'fedjax-rep: error: ...'."""
  lines = capsys.readouterr().err.splitlines()
  assert len(lines) == 1 and lines[0].startswith("fedjax-rep: error: "), lines
  return lines[0]


@pytest.mark.slow  # the fast tier keeps a grid over a plugin's option in one program
def test_a_plugin_algorithm_runs_in_a_recipe_with_its_option(plugin, tmp_path, capsys,
                                                              monkeypatch):
  labels = []
  line = plotting.line
  monkeypatch.setattr(plotting, "line", lambda ax, rows, x, y, label, **kw: (
      labels.append(label), line(ax, rows, x, y, label, **kw))[1])
  out = tmp_path / "out"
  assert cli.main(["run", *SMALL, "--plugin", str(plugin), "--set", "server_beta=0.5",
                   "--out", str(out)]) == 0
  with open(out / "metrics.csv") as f:
    rows = [r for r in csv.DictReader(f) if r["algorithm"] == NAME]
  assert [r["round"] for r in rows] == ["1", "2", "3", "4"] and rows[-1]["test_accuracy"]
  assert (out / "digits-personalized.png").stat().st_size > 0 and NAME in labels
  saved = json.loads((out / "config.json").read_text())
  assert saved["plugins"] == [{"path": str(plugin),
                               "sha256": hashlib.sha256(plugin.read_bytes()).hexdigest()}]
  assert saved["config"]["options"] == [["server_beta", 0.5]]
  assert cli.main(["run", "--resume", str(out)]) == 0  # the same plugin: nothing to do
  assert "holds a complete run" in capsys.readouterr().out
  plugin.write_text(PLUGIN + "# changed\n")
  assert cli.main(["run", "--resume", str(out)]) == 2
  assert f"plugin {plugin} changed since" in one_error_line(capsys)
  assert cli.main(["run", "--from-config", str(out / "config.json"), "--out",
                   str(tmp_path / "again")]) == 2
  assert "changed since" in one_error_line(capsys)
  assert cli.main(["run", *SMALL, "--plugin", str(plugin), "--set", "server_beta=0.5",
                   "--out", str(out)]) == 2  # the same command: its parts are another code's
  assert "a different configuration, seeds or grid (or plugins)" in one_error_line(capsys)
  plugin.unlink()
  assert cli.main(["run", "--resume", str(out)]) == 2
  assert f"ran with plugin {plugin}, which is missing" in one_error_line(capsys)
  assert not (tmp_path / "again").exists()


def test_the_option_is_a_key_of_the_recipe_checked_by_its_option(plugin, tmp_path, capsys,
                                                                  compiles):
  plugins.load(str(plugin))
  config = fr.resolve("digits-personalized",
                      overrides=[f"algorithms=fedrep,{NAME}", "server_beta=0.25"])
  assert config.options == (("server_beta", 0.25),)
  assert float(neural.hparams(config).options["server_beta"]) == 0.25
  with pytest.raises(fr.ConfigError, match=r"server_beta=1.5 is out of range: server_beta "
                                           r"must be in \[0, 0.999\]"):
    fr.resolve("digits-personalized", overrides=[f"algorithms={NAME}", "server_beta=1.5"])
  with pytest.raises(fr.ConfigError, match=r"unknown configuration key 'server_bta'; valid "
                                           r"keys: .*; options of the algorithms in "
                                           r"`algorithms`: server_beta \(another"):
    fr.resolve("digits-personalized", overrides=[f"algorithms={NAME}", "server_bta=0.5"])
  with pytest.raises(fr.ConfigError, match="unknown configuration key 'server_beta'; .*; "
                                           "options of the algorithms in `algorithms`: none"):
    fr.resolve("digits-personalized", overrides=["server_beta=0.5"])  # NAME does not run
  out = tmp_path / "out"
  assert cli.main(["run", *SMALL, "--plugin", str(plugin), "--set", "server_beta=2",
                   "--out", str(out)]) == 2
  assert "server_beta=2.0 is out of range" in one_error_line(capsys)
  assert cli.main(["run", *SMALL, "--plugin", str(plugin), "--grid", "server_beta=0.5,x",
                   "--out", str(out)]) == 2
  assert "'x' is not valid; server_beta must be a number in [0, 0.999]" in one_error_line(capsys)
  assert compiles.count == 0 and not out.exists()


@pytest.mark.slow  # the fast tier keeps test_neural_grid's option swept in one program
def test_a_grid_over_the_option_compiles_the_round_once(plugin, compiles):
  hits = []
  jax.monitoring.register_event_listener(  # a program loaded from the persistent cache
      lambda name, **kw: hits.append(name) if name == "/jax/compilation_cache/cache_hits"
      else None)
  plugins.load(str(plugin))
  small = dict(quick=True, seeds=1, overrides=[f"algorithms={NAME}", "rounds=2",
                                               "eval_every=1"], progress=False)
  runner.run("digits-personalized", grid={"server_beta": [0.0, 0.1, 0.2]}, **small)
  compiles.reset()
  hits.clear()
  rows, _ = runner.run("digits-personalized", grid=["server_beta=0.3,0.6,0.9"], **small)
  assert compiles.count == 0 and not hits
  final = {r["server_beta"]: r["test_accuracy"] for r in rows if r["round"] == 2}
  assert sorted(final) == [0.3, 0.6, 0.9] and len(set(final.values())) == 3


@pytest.mark.parametrize("name,text,pattern", [
    ("missing.py", None, r"--plugin \S+missing.py: no such file"),
    ("plugin.txt", "x = 1\n", r"--plugin \S+plugin.txt is not a .py file"),
    ("syntax.py", "import fedjax_rep\ndef f(:\n", r"--plugin (\S+): syntax error at \1:2: "),
    ("raising.py", "x = 1\n\nraise RuntimeError('no\\ndata')\n",
     r"--plugin (\S+) raised RuntimeError at \1:3 while importing: no data; fix the file"),
    ("builtin.py", "import fedjax_rep as fr\n"
                   "fr.register_algorithm('fedrep', 'mine', fr.nn.fedavg.FedAvg)\n",
     r"raised ValueError at \S+builtin.py:2 while importing: neural algorithm 'fedrep' is "
     r"registered already \(by fedjax_rep.nn.fedrep.FedRep\); register FedAvg under another "
     r"name"),
])
def test_a_broken_plugin_is_one_line_before_anything_compiles(name, text, pattern, tmp_path,
                                                               capsys, compiles):
  path = tmp_path / name
  if text is not None:
    path.write_text(text)
  out = tmp_path / "out"
  assert cli.main(["run", *SMALL, "--plugin", str(path), "--out", str(out)]) == 2
  assert re.search(pattern, one_error_line(capsys))
  assert compiles.count == 0 and not out.exists()
  assert cli.main(["list", "--plugin", str(path)]) == 2
  assert re.search(pattern, one_error_line(capsys))


def test_list_shows_a_plugins_algorithms(plugin, capsys):
  assert cli.main(["list", "--plugin", str(plugin)]) == 0
  neural_part = capsys.readouterr().out.split("neural algorithms:")[1]
  assert f"  {NAME}  FedAvg whose server keeps server_beta" in neural_part
  assert re.search(rf"  {NAME}  .*\(options: server_beta=\S+\)", neural_part)


def test_the_same_plugin_loads_again_but_no_name_twice(plugin, tmp_path):
  plugins.load(str(plugin))
  plugin.write_text(PLUGIN.replace("0.999", "0.99"))  # changed: imported again, allowed
  assert plugins.load(str(plugin))["sha256"] == hashlib.sha256(plugin.read_bytes()).hexdigest()
  assert nn_algorithms.options()["server_beta"].high == 0.99
  other = tmp_path / "other.py"
  other.write_text(PLUGIN)  # another file registering the same name
  with pytest.raises(plugins.PluginError, match=f"'{NAME}' is registered already"):
    plugins.load(str(other))


@pytest.mark.slow  # the fast tier keeps test_user_algorithms' plugin in a Table-1 recipe
@pytest.mark.parametrize("recipe,setting", [  # one small setting each, to keep CI short
    ("fedrep-table1-cifar10", ["num_clients=10", "classes_per_client=2"]),
    ("flute-table1", ["num_clients=20", "classes_per_client=2"]),
    ("table1-synthetic", ["num_clients=20", "alpha=1", "beta=1"])])
def test_a_plugin_algorithm_runs_in_a_table1_recipe_beside_built_in_ones(recipe, setting,
                                                                          plugin, tmp_path):
  """The Table-1 recipes take a registered algorithm that their paper does not have: its
  table1.csv row has no paper number, its bar its name."""
  from fedjax_rep.recipes.kit import table
  out = tmp_path / "out"
  items = [f"algorithms=fedrep,{NAME}", "rounds=2", "eval_every=1", *setting]
  assert cli.main(["run", recipe, "--quick", "--plugin", str(plugin), "--no-progress",
                   *[arg for item in items for arg in ("--set", item)],
                   "--out", str(out)]) == 0
  with open(out / "table1.csv") as f:
    rows = list(csv.DictReader(f))
  assert {r["algorithm"] for r in rows} == {"fedrep", NAME}
  assert all(r["paper_test_accuracy"] == "" for r in rows if r["algorithm"] == NAME)
  assert 0 <= float(rows[-1]["test_accuracy"]) <= 1
  assert (out / f"{recipe}.png").stat().st_size > 0
  assert table.label(NAME, {}) == f"{NAME} (not in paper)"
