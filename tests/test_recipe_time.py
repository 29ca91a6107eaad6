"""benchmarks/recipe_time.py's compilation breakdown: JAX's event names, and which program a
trace, a lowering and an XLA compilation are counted for."""

import importlib
import importlib.util
import os
import sys

import jax
import jax.numpy as jnp
import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "recipe_time.py")
_SPEC = importlib.util.spec_from_file_location("recipe_time", _PATH)
recipe_time = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(recipe_time)


def test_a_program_gets_its_own_trace_not_the_traces_of_the_functions_it_calls():
  T, L, C = recipe_time.TRACE, recipe_time.LOWER, recipe_time.COMPILE
  events = [(T, "inner", 0.5), (T, "outer", 2.0), (L, "jit(outer)", 1.0),
            (C, "jit(outer)", 4.0), (T, "outer", 1.5), (L, "jit(outer)", 0.5),
            (T, "shapes_only", 9.0), (T, "small", 0.25), (L, "jit(small)", 0.125),
            ("/jax/other", "x", 7.0)]
  programs = recipe_time.compilation(events)
  assert programs == {
      "jit(outer)": {"lowered": 2, "compiled": 1, "trace": 3.5, "lower": 1.5, "xla": 4.0},
      "jit(small)": {"lowered": 1, "compiled": 0, "trace": 0.25, "lower": 0.125, "xla": 0.0}}
  assert recipe_time.compilation_totals(programs) == {
      "lowered": 3, "compiled": 1, "trace": 3.75, "lower": 1.625, "xla": 4.0,
      "compiling": pytest.approx(9.375)}


def test_jax_reports_the_events_the_breakdown_reads():
  events = []

  def listener(event, seconds, **kw):
    events.append((event, kw.get("fun_name", ""), seconds))

  def breakdown_probe(x):
    return jnp.sin(x) @ x.T

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    jax.jit(breakdown_probe)(jnp.ones((3, 3)))
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  probe = recipe_time.compilation(events)["jit(breakdown_probe)"]
  assert probe["lowered"] == probe["compiled"] == 1
  assert probe["trace"] > 0 and probe["lower"] > 0 and probe["xla"] > 0


@pytest.mark.slow
def test_quick_recipes_times_a_first_run_and_counts_its_compiled_programs(tmp_path):
  """benchmarks/quick_recipes.py's run of one recipe: its seconds, its compiling (a share of
  them) and its programs, from a real `fedjax-rep run RECIPE --quick --no-compile-cache`."""
  benchmarks = os.path.dirname(_PATH)
  sys.path.insert(0, benchmarks)  # quick_recipes imports its neighbour recipe_time
  try:
    quick_recipes = importlib.import_module("quick_recipes")
  finally:
    sys.path.remove(benchmarks)
  row = quick_recipes.first_run("fedrep-fig3", str(tmp_path))
  assert row["error"] is None and row["seconds"] > 0 and row["programs"] > 0
  assert 0 < row["compiling"] < row["seconds"] and row["share"] == pytest.approx(
      row["compiling"] / row["seconds"])
  assert os.path.exists(os.path.join(row["out"], "metrics.csv"))
  assert "fedrep-fig3" in quick_recipes.recipe_names()
