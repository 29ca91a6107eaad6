"""Configuration checks and the command line: bad input fails early with a clear message."""

import csv
import json
import os
import re

import pytest

import fedjax_rep as fr
from fedjax_rep import cli
from fedjax_rep.experiments import config as cfg

TINY = ["num_clients=10,20", "rounds=3", "samples_per_client=4"]


@pytest.mark.parametrize("item,pattern", [
    ("rep_dim=11", r"rep_dim=11 is out of range.*\[1, dim=10\]"),
    ("participation=0", r"participation=0.0 is out of range.*\(0, 1\]"),
    ("participation=1.5", r"participation=1.5 is out of range.*\(0, 1\]"),
    ("lr=-0.1", r"lr=-0.1 is out of range.*\(0, inf\)"),
    ("lr=fast", r"'fast' is not valid; lr must be a number in \(0, inf\)"),
    ("lr=nan", r"lr=nan is out of range"),
    ("rounds=0", r"rounds=0 is out of range.*integer in \[1, inf\)"),
    ("rounds=2.5", r"'2.5' is not valid; rounds must be an integer"),
    ("learning_rate=0.1", r"unknown configuration key 'learning_rate'; valid keys: num_clients"),
    ("num_clients=10,x", r"'x' is not valid; num_clients must be a comma-separated list"),
    ("data_mode=streaming", r"data_mode='streaming' is out of range.*one of fixed, fresh"),
    ("lr", r"--set expects KEY=VALUE"),
])
def test_bad_settings_fail_before_any_compilation(item, pattern, compiles):
  with pytest.raises(fr.ConfigError, match=pattern):
    fr.resolve("fedrep-fig3", overrides=[item])
  assert compiles.count == 0


@pytest.mark.parametrize("item,pattern", [
    ("classes_per_client=11", r"classes_per_client must be in \[1, 10\]"),
    ("partition=shards", r"partition='shards' is out of range.*one of classes, dirichlet, iid"),
    ("momentum=1", r"momentum=1.0 is out of range.*\[0, 1\)"),
    ("num_clients=5000", r"num_clients must be in \[1, 1347\]"),
    ("dirichlet_alpha=0", r"dirichlet_alpha=0.0 is out of range"),
    # digits-personalized takes every neural algorithm of the registry (scaffold, fed-mtl, ...)
    ("algorithms=fedrep,scafold", r"algorithms='scafold' is out of range.*fedrep, fedper.*"
                                  r"scaffold.*fed-mtl, fedcp"),
    ("batch_size=0", r"batch_size=0 is out of range"),
    ("summary=median", r"summary='median' is out of range.*last10, last, best"),
])
def test_bad_neural_settings_fail_before_any_compilation(item, pattern, compiles):
  with pytest.raises(fr.ConfigError, match=pattern):
    fr.resolve("digits-personalized", overrides=[item])
  assert compiles.count == 0


@pytest.mark.parametrize("recipe", ["fedrep-fig1", "fedrep-fig4"])
def test_native_kernel_is_opt_in_and_checked_before_any_work(recipe, tmp_path, monkeypatch,
                                                              compiles):
  """kernel defaults to xla; native needs full participation, and a compiler that fails is
  a ConfigError saying so, before anything compiles."""
  assert fr.resolve(recipe).kernel == "xla"
  with pytest.raises(fr.ConfigError, match=r"kernel=native runs FedRep's rounds with full "
                                           r"participation only: set participation=1"):
    fr.resolve(recipe, overrides=["kernel=native"])
  with pytest.raises(fr.ConfigError, match="kernel='auto' is out of range.*xla, native"):
    fr.resolve(recipe, overrides=["kernel=auto"])
  failing = tmp_path / "cxx"
  failing.write_text("#!/bin/sh\necho 'error: no compiler here' >&2\nexit 1\n")
  failing.chmod(0o755)
  monkeypatch.setenv("CXX", str(failing))
  monkeypatch.setenv("FEDJAX_REP_CACHE", str(tmp_path / "cache"))
  # As in a fresh process: another test in this worker may have registered the kernel.
  from fedjax_rep.native import build
  monkeypatch.setattr(build, "_registered", set())
  with pytest.raises(fr.ConfigError, match="kernel=native: .*no compiler here"):
    fr.resolve(recipe, overrides=["kernel=native", "participation=1"])
  assert compiles.count == 0


def test_cli_reports_bad_input_and_exits_2(capsys, tmp_path, compiles):
  assert cli.main(["run", "fedrep-fig3", "--set", "rep_dim=20", "--out", str(tmp_path)]) == 2
  assert "rep_dim=20 is out of range" in capsys.readouterr().err
  assert cli.main(["run", "no-such-recipe"]) == 2
  err = capsys.readouterr().err
  assert "unknown recipe 'no-such-recipe'; known recipes:" in err and "fedrep-fig3" in err
  assert cli.main(["run", "fedrep-fig1", "--seeds", "0"]) == 2
  assert "--seeds must be an integer >= 1" in capsys.readouterr().err
  assert compiles.count == 0
  assert not os.listdir(tmp_path)


def test_quick_and_overrides_resolve():
  config = fr.resolve("fedrep-fig3", quick=True, overrides=["num_clients=5,50", "lr=0.2"])
  assert config.num_clients == (5, 50) and config.lr == 0.2 and config.rounds == 100


def test_list(capsys):
  assert cli.main(["list"]) == 0
  out = capsys.readouterr().out
  for name in ("fedrep-fig1", "fedrep-fig3", "fedrep-fig4", "fedavg-ft-fig1", "fedavg-ft-fig3",
               "fedrep", "gd-gd", "10gd-gd", "fedavg", "fedavg-tau2", "d-gd", "local"):
    assert f"  {name} " in out
  recipes, rest = out.split("linear algorithms:")
  linear, neural = rest.split("neural algorithms:")
  assert "  digits-personalized " in recipes
  assert "  flute " in linear and "  local " not in linear  # local only is no round algorithm
  for name in ("fedrep", "fedper", "lg-fedavg", "fedavg", "fedavg-ft", "local"):
    assert f"  {name} " in neural
  fedprox = next(line for line in neural.splitlines() if line.startswith("  fedprox "))
  assert fedprox.endswith("(options: prox_mu=0.01)")  # declared once, on FedProx
  assert "no_bias_decay" not in neural  # the conventions' flags are the recipes' to set


def test_list_aligns_the_descriptions_of_each_section(capsys):
  assert cli.main(["list"]) == 0
  sections = {}
  for line in capsys.readouterr().out.splitlines():
    if not line.startswith(" "):
      title = line
      continue
    name, gap = re.match(r"  (\S+)( +)\S", line).groups()
    sections.setdefault(title, []).append((name, 2 + len(name) + len(gap)))
  assert len(sections) >= 4 and "recipes:" in sections
  for title, rows in sections.items():
    longest = max(len(name) for name, _ in rows)
    assert {column for _, column in rows} == {2 + longest + 2}, (title, rows)
  assert max(len(name) for name, _ in sections["recipes:"]) > 20  # names past the old width


def test_run_help_names_the_compile_cache_variables(capsys):
  with pytest.raises(SystemExit):
    cli.main(["run", "--help"])
  text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
  assert "$FEDJAX_REP_CACHE" in text and "$XDG_CACHE_HOME/fedjax_rep/jax" in text


def test_resume_of_a_directory_that_is_no_run_says_so(tmp_path, capsys, compiles):
  empty, notes = tmp_path / "empty", tmp_path / "notes"
  empty.mkdir()
  notes.mkdir()
  (notes / "notes.txt").write_text("")
  for directory, problem in ((empty, "is not a run directory (no config.json in it)"),
                             (notes, "is not a run directory (no config.json in it)"),
                             (tmp_path / "missing", "does not exist")):
    assert cli.main(["run", "--resume", str(directory)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(
        f"fedjax-rep: error: --resume {directory} {problem}: give the --out directory of an "
        f"earlier `fedjax-rep run`"), error
    assert "config.json of a run" not in error
  assert cli.main(["run", "--from-config", str(empty / "config.json")]) == 2
  error = capsys.readouterr().err
  assert f"cannot read {empty / 'config.json'}" in error and "give the config.json" in error
  assert not os.listdir(empty) and os.listdir(notes) == ["notes.txt"]
  assert not (tmp_path / "missing").exists() and compiles.count == 0


def test_run_writes_outputs_and_resumes(tmp_path, monkeypatch):
  out = str(tmp_path / "run")
  args = ["run", "fedrep-fig3", "--seeds", "2", "--out", out, "--no-progress"]
  for item in TINY:
    args += ["--set", item]
  assert cli.main(args) == 0
  with open(os.path.join(out, "metrics.csv")) as f:
    rows = list(csv.DictReader(f))
  assert list(rows[0])[:3] == ["algorithm", "seed", "round"]
  assert {"num_clients", "principal_angle", "train_loss"} <= set(rows[0])
  assert len(rows) == 3 * 2 * 2 * 3  # algorithms x n x seeds x rounds
  assert {r["algorithm"] for r in rows} == {"fedrep", "gd-gd", "10gd-gd"}
  with open(os.path.join(out, "config.json")) as f:
    config = json.load(f)
  assert config["config"]["num_clients"] == [10, 20] and config["seeds"] == 2
  assert "jax" in config["versions"]
  assert config["code"]["kernel"] == "xla" and "kernel_build" not in config["code"]
  assert len(config["code"]["source"]) == 64 and config["code"]["revision"]
  with open(os.path.join(out, "fedrep-fig3.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"

  # Resume: every unit is on disk, so a second run computes nothing.
  from fedjax_rep.experiments import batch
  monkeypatch.setattr(batch.loop, "run", lambda *a, **k: pytest.fail("recomputed"))
  assert cli.main(args) == 0
  with open(os.path.join(out, "metrics.csv")) as f:
    assert list(csv.DictReader(f)) == rows

  # A different configuration in the same directory is refused, not mixed in.
  assert cli.main(args + ["--set", "lr=0.2"]) == 2


def test_python_api_returns_rows_without_files(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  rows, config = fr.run_recipe("fedrep-fig3", seeds=1, overrides=TINY, progress=False)
  assert config.rounds == 3 and len(rows) == 3 * 2 * 3
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("recipe,items,pattern", [
    ("fedrep-fig3", ["devices=0"], r"devices=0 is out of range.*integer in \[1, inf\) or all"),
    ("fedrep-fig3", ["devices=two"], r"'two' is not valid; devices must be .* or all"),
    ("fedrep-fig3", ["devices=2"], r"devices=2 is out of range: JAX sees 1 devices"),
    ("fedrep-fig3", ["num_clients=10", "cohort_groups=4"],
     r"num_clients=10 .* must split evenly.*4 cohort groups"),
    ("flute-fig3", ["cohort_groups=3"], r"FLUTE .*: one device only, cannot run sharded"),
    ("srpfl-linear", ["devices=all", "cohort_groups=1"], r"SRPFL's timed schedules: one device"),
    ("fedrep-fig1", ["cohort_groups=2"],
     r"algorithm local cannot run sharded .*only fedrep, gd-gd, 10gd-gd shard"),
    ("flute-table1", ["cohort_groups=1"], r"algorithm flute cannot run sharded .*masked_round"),
])
def test_placement_refused_before_any_work(recipe, items, pattern, capsys, tmp_path, compiles):
  """devices and cohort_groups out of range, or for an algorithm that cannot shard: exit 2
  with one line naming the setting or the algorithm, nothing compiled, no directory."""
  args = [a for item in items for a in ("--set", item)]
  assert cli.main(["run", recipe, "--quick", *args, "--out", str(tmp_path / "out")]) == 2
  error = capsys.readouterr().err
  assert len(error.strip().splitlines()) == 1 and re.search(pattern, error), error
  assert compiles.count == 0 and not (tmp_path / "out").exists()


def test_placement_fields_are_listed_last():
  """Every recipe has devices and cohort_groups, listed after its own keys."""
  assert list(cfg.fields(type(fr.resolve("fedrep-fig3"))))[-2:] == ["devices", "cohort_groups"]
  with pytest.raises(fr.ConfigError, match=r"valid keys: .*, devices, cohort_groups; "
                                           r"options of the algorithms"):
    fr.resolve("digits-personalized", overrides=["no_such_key=1"])


@pytest.mark.parametrize("quick", [False, True])
def test_every_recipes_configuration_replays(quick, tmp_path):
  """A config.json's settings (auto ones, None, included) give back the same configuration
  (what --resume and --from-config read)."""
  from fedjax_rep.experiments import recipe_registry
  from fedjax_rep.experiments import runner
  from fedjax_rep.data.missing import DataMissing
  for name in recipe_registry.all_recipes():
    try:
      config = recipe_registry.resolve(name, quick=quick)
    except DataMissing:  # a full-size real-data recipe checks its files first
      continue
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"recipe": name, "quick": quick,
                                "config": cfg.saved(config)}))
    what = runner.replay(str(path))
    assert recipe_registry.resolve(name, quick=quick, overrides=what["overrides"]) == config, name


@pytest.mark.parametrize("environ,expected", [
    ({}, None),
    ({"SLURM_NTASKS": "4"}, None),  # an allocation, not a step of several tasks
    ({"SLURM_STEP_NUM_TASKS": "2"}, {}),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, {}),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "NUM_PROCESSES": "2", "PROCESS_ID": "1"},
     {"coordinator_address": "h:1", "num_processes": 2, "process_id": 1}),
    ({"NUM_PROCESSES": "2"}, "NUM_PROCESSES set without JAX_COORDINATOR_ADDRESS, PROCESS_ID"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "NUM_PROCESSES": "two", "PROCESS_ID": "0"},
     "must be integers"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "NUM_PROCESSES": "2", "PROCESS_ID": "2"},
     r"PROCESS_ID in \[0, NUM_PROCESSES\)"),
])
def test_the_job_the_environment_names(environ, expected):
  """A job of several processes from the environment, or a clear error naming the variable."""
  from fedjax_rep.core import distributed
  if isinstance(expected, str):
    with pytest.raises(distributed.JobError, match=expected):
      distributed.job_environment(environ)
  else:
    assert distributed.job_environment(environ) == expected


JOB = {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:1", "NUM_PROCESSES": "2", "PROCESS_ID": "1"}


def joined(monkeypatch) -> list:
  """The keywords of every `jax.distributed.initialize` call from now on (none is made)."""
  import jax
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **keywords: calls.append(keywords))
  monkeypatch.setattr(jax.config, "update", lambda name, value: None)
  return calls


def test_the_heartbeat_is_read_when_a_job_is_joined(monkeypatch):
  """FEDJAX_REP_HEARTBEAT_SECONDS set after fedjax_rep is imported is the one the job gets;
  unset, the default."""
  from fedjax_rep.core import distributed
  calls = joined(monkeypatch)
  for name, value in JOB.items():
    monkeypatch.setenv(name, value)
  monkeypatch.setenv("FEDJAX_REP_HEARTBEAT_SECONDS", "7")
  assert distributed.join()
  monkeypatch.delenv("FEDJAX_REP_HEARTBEAT_SECONDS")
  assert distributed.join()
  assert [call["heartbeat_timeout_seconds"] for call in calls] == [
      7, distributed.DEFAULT_HEARTBEAT_SECONDS]
  assert calls[0]["process_id"] == 1 and calls[0]["num_processes"] == 2


@pytest.mark.parametrize("value", ["0", "-3", "2.5", "ten"])
def test_a_bad_heartbeat_fails_in_one_line_before_any_work(
    monkeypatch, capsys, tmp_path, compiles, value):
  from fedjax_rep.core import distributed
  calls = joined(monkeypatch)
  for name, job_value in JOB.items():
    monkeypatch.setenv(name, job_value)
  monkeypatch.setenv("FEDJAX_REP_HEARTBEAT_SECONDS", value)
  expected = (f"FEDJAX_REP_HEARTBEAT_SECONDS='{value}' must be an integer >= 1 (the seconds "
              f"of silence after which a process of a job counts as dead); set it to e.g. 30, "
              f"or unset it for the default 30")
  with pytest.raises(distributed.JobError) as refused:
    distributed.join()
  assert str(refused.value) == expected
  assert cli.main(["run", "fedrep-fig3", "--quick", "--out", str(tmp_path / "out")]) == 2
  assert capsys.readouterr().err == f"fedjax-rep: error: {expected}\n"
  assert calls == [] and compiles.count == 0 and not (tmp_path / "out").exists()


def test_a_partial_job_environment_fails_in_one_line(monkeypatch, capsys, tmp_path, compiles):
  monkeypatch.setenv("NUM_PROCESSES", "2")
  assert cli.main(["run", "fedrep-fig3", "--quick", "--out", str(tmp_path / "out")]) == 2
  assert "NUM_PROCESSES set without" in capsys.readouterr().err
  assert compiles.count == 0 and not (tmp_path / "out").exists()
