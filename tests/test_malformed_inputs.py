"""Malformed input refused before any work: the --set / --grid grammar (property tests on
generated strings, and through the command line) and the shapes and lengths of the data
constructors (a table of bad inputs)."""

import contextlib
import dataclasses
import io
import os
import re
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_rep as fr
from fedjax_rep import cli
from fedjax_rep.experiments import config as cfg

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
FEW = hypothesis.settings(max_examples=60, deadline=None)


@dataclasses.dataclass(frozen=True)
class Grammar(cfg.Config):
  """One field of each kind the grammar parses."""
  lr: float = cfg.lr(0.1)
  rounds: int = cfg.rounds(5)
  sizes: tuple = cfg.positive_int("a list of sizes", (1, 2), sequence=True)
  mode: str = cfg.choice("a choice", "fixed", ("fixed", "fresh", "population"))
  decay: float | None = cfg.setting(None, cfg.Check(float, low=0.0, optional=True),
                                    "auto or a number >= 0")
  devices: int | str = cfg.setting(1, cfg.Check(int, low=1, words=("all",)), "a word too")
  modes: tuple = cfg.choice("a list of choices", ("fixed",), ("fixed", "fresh", "population"),
                            sequence=True)


CONFIG = Grammar()
FIELDS = [f.name for f in dataclasses.fields(Grammar) if f.name != "cohort_groups"]
LISTS = ("sizes", "modes")

# Values of each field as (text, value): written in the ways the grammar takes.
floats = st.floats(1e-6, 1e6)
VALUES = {
    "lr": st.one_of(floats.map(lambda v: (repr(v), v)),
                    floats.map(lambda v: (f"{v:.3e}", float(f"{v:.3e}")))),
    "rounds": st.integers(1, 10 ** 6).flatmap(lambda n: st.sampled_from(
        [(str(n), n), (f"{n}.0", n), (f"+{n}", n)])),
    "sizes": st.integers(1, 999).map(lambda n: (str(n), n)),
    "mode": st.sampled_from(["fixed", "fresh", "population"]).map(lambda w: (w, w)),
    "modes": st.sampled_from(["fixed", "fresh", "population"]).map(lambda w: (w, w)),
    "decay": st.one_of(st.just(("auto", None)), floats.map(lambda v: (repr(v), v))),
    "devices": st.one_of(st.just(("all", "all")), st.integers(1, 64).map(lambda n: (str(n), n))),
}
SPACE = st.sampled_from(["", " ", "  "])


@st.composite
def well_formed(draw, option):
  """(item, key, intended values): KEY=V1,V2,... with spaces around items and distinct
  values (one value for --set of a single-valued field)."""
  key = draw(st.sampled_from(FIELDS))
  several = option == "--grid" or key in LISTS
  pairs = draw(st.lists(VALUES[key], min_size=1, max_size=4 if several else 1,
                        unique_by=lambda pair: pair[1]))
  text = ",".join(draw(SPACE) + item + draw(SPACE) for item, _ in pairs)
  return f"{key}={text}", key, tuple(value for _, value in pairs)


@FEW
@hypothesis.given(well_formed("--set"))
def test_well_formed_settings_parse_to_their_values(case):
  item, key, values = case
  got = getattr(cfg.override(CONFIG, [item]), key)
  assert got == (values if key in LISTS else values[0])


@FEW
@hypothesis.given(well_formed("--grid"))
def test_well_formed_grids_parse_to_their_values(case):
  item, key, values = case
  assert cfg.sweep(CONFIG, [item]).grid == {key: values}


BAD_ITEMS = {"lr": ["fast", "1_000", "0x10", "1 2", "0.1;0.2", "--1", "1e", ".", "0,1.5.2"],
             "rounds": ["2.5", "three", "1e-1", "nan", "inf", "1e400"],
             "sizes": ["0.5", "a", "-"], "mode": ["streaming", "FIXED"], "modes": ["fixed "
             "fresh", "auto"], "decay": ["AUTO", "x"],
             "devices": ["any", "1.5"]}


@st.composite
def malformed(draw, option):
  """(item, what is wrong): a well-formed item broken in one way."""
  item, key, _ = draw(well_formed(option))
  text = item.partition("=")[2]
  items = text.split(",")
  fault = draw(st.sampled_from(["empty", "leading", "trailing", "double", "equals", "no equals",
                                "no key", "unknown key", "bad item", "repeated"]))
  if fault == "empty":
    return f"{key}={draw(SPACE)}", fault
  if fault == "leading":
    return f"{key}=,{text}", fault
  if fault == "trailing":
    return f"{key}={text},", fault
  if fault == "double":
    at = draw(st.integers(0, len(items)))
    return f"{key}={','.join(items[:at] + [draw(SPACE)] + items[at:])}", fault
  if fault == "equals":
    at = draw(st.integers(0, len(text)))
    return f"{key}={text[:at]}={text[at:]}", fault
  if fault == "no equals":
    return f"{key}{text}", fault
  if fault == "no key":
    return f"{draw(SPACE)}={text}", fault
  if fault == "unknown key":
    return f"{key}x={text}", fault
  if fault == "bad item":
    at = draw(st.integers(0, len(items)))
    bad = draw(st.sampled_from(BAD_ITEMS[key]))
    return f"{key}={','.join(items[:at] + [bad] + items[at:])}", fault
  if option == "--grid":  # a value twice: refused in a grid
    return f"{key}={text},{items[draw(st.integers(0, len(items) - 1))]}", fault
  return f"{key}={text},{text}", fault  # --set: more than one value, or fine for a list


KEY_FAULTS = ("no equals", "no key", "unknown key")  # the message names the option, not a key


def refused(option, item) -> str:
  """The ConfigError message of `option` item, or '' where it parses."""
  try:
    if option == "--set":
      cfg.override(CONFIG, [item])
    else:
      cfg.sweep(CONFIG, [item])
  except cfg.ConfigError as error:
    return str(error)
  return ""


@FEW
@hypothesis.given(st.sampled_from(["--set", "--grid"]).flatmap(
    lambda option: st.tuples(st.just(option), malformed(option))))
def test_malformed_items_are_always_refused_in_one_line(case):
  option, (item, fault) = case
  if fault == "repeated" and option == "--set" and item.startswith("sizes="):
    assert not refused(option, item)  # a list may repeat a value in --set (paired lists)
    return
  message = refused(option, item)
  assert message and "\n" not in message, (item, fault)
  named = option if fault in KEY_FAULTS else item.partition("=")[0]
  assert named in message, (item, message)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(st.sampled_from(["--set", "--grid"]), st.sampled_from(FIELDS),
                  st.text(" ,=.0123456789e+-autoflixdn", max_size=12))
def test_any_string_parses_as_the_grammar_says_or_is_refused(option, key, text):
  """Every string is a ConfigError or a value; a value only for text in the grammar: single
  commas between non-empty items, no '=', each item a number (or a word the field takes),
  distinct in a grid."""
  item = f"{key}={text}"
  items = [t.strip() for t in text.split(",")]
  message = refused(option, item)
  if message:
    assert "\n" not in message
    return
  assert "=" not in text and "" not in items, item
  assert option == "--grid" or key in LISTS or len(items) == 1, item
  assert option != "--grid" or len(set(items)) == len(items), item
  choices = ("fixed", "fresh", "population")
  words = {"mode": choices, "modes": choices, "decay": ("auto",), "devices": ("all",)}
  for t in items:
    assert t in words.get(key, ()) or re.fullmatch(
        r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?|[+-]?(nan|inf|infinity)", t, re.I), item


def test_a_list_of_choices_names_each_once():
  """A list of numbers may repeat one (Table-1's paired lists); a list of choices (e.g. the
  algorithms to compare) may not."""
  assert cfg.override(CONFIG, ["sizes=2,2"]).sizes == (2, 2)
  with pytest.raises(cfg.ConfigError, match=r"^modes=fixed,fresh,fixed names a choice twice: "
                                            r"modes must be a comma-separated list, each one "
                                            r"of fixed, fresh, population, each once$"):
    cfg.override(CONFIG, ["modes=fixed,fresh,fixed"])


def test_a_key_given_twice_in_set_is_refused():
  with pytest.raises(cfg.ConfigError, match=r"^lr is given twice in --set \(lr=0.1 and lr=0.2\); "
                                            r"give it once, as --set lr=VALUE$"):
    cfg.override(CONFIG, ["lr=0.1", "lr=0.2"])


@pytest.mark.parametrize("grid,message", [
    ({"lr": "0.1,0.2"}, r"grid\['lr'\] = '0.1,0.2' is not a list of values; give a list, e.g. "
                        r"grid=\{'lr': \[V1, V2\]\}"),
    ({"lr": 0.1}, r"grid\['lr'\] = 0.1 is not a list"),
    ({"lr": [0.1, 0.1]}, r"--grid lr=0.1,0.1: 0.1 is given twice; give one or more distinct"),
    ({"lr": []}, r"--grid lr=: give one or more distinct values of lr"),
])
def test_a_python_grid_of_no_list_or_repeated_values_is_refused(grid, message):
  with pytest.raises(cfg.ConfigError, match=message):
    cfg.sweep(CONFIG, grid)


# The issue's cases and each kind of fault, through the command line: exit 2, one line
# naming the argument, nothing compiled, no --out directory.
CLI_CASES = [
    (["--grid", "lr=0.1,,0.2"], r"--grid lr=0.1,,0.2: an empty value between two commas; give "
                                r"one or more distinct values of lr, each a number in \(0, inf\), "
                                r"separated by single commas"),
    (["--grid", "lr=0.1,0.1"], r"--grid lr=0.1,0.1: 0.1 is given twice; give one or more "
                               r"distinct values of lr"),
    (["--grid", "lr=,0.1"], r"--grid lr=,0.1: a leading comma; give"),
    (["--grid", "num_clients=10,"], r"--grid num_clients=10,: a trailing comma; give one or "
                                    r"more distinct values of num_clients, each an integer"),
    (["--grid", "lr=0.1=0.2"], r"--grid lr=0.1=0.2: a stray '=' in the value; give"),
    (["--grid", "rounds=2.5"], r"--grid rounds=2.5: '2.5' is not valid; rounds must be an "
                               r"integer in \[1, inf\)"),
    (["--set", "lr=0.1,0.2"], r"--set lr=0.1,0.2: lr takes one value, not 2; give one value of "
                              r"lr: a number in \(0, inf\), or sweep them with --grid "
                              r"lr=0.1,0.2"),
    (["--set", "num_clients=10,,20"], r"--set num_clients=10,,20: an empty value between two "
                                      r"commas; give one or more values of num_clients"),
    (["--set", "lr=1_000"], r"--set lr=1_000: '1_000' is not valid; lr must be a number"),
    (["--set", "lr="], r"--set lr=: give one value of lr: a number in \(0, inf\)"),
    (["--set", "=0.1"], r"--set expects KEY=VALUE, got '=0.1'; valid keys: num_clients"),
    (["--set", "lr=0.1", "--set", "lr=0.2"], r"lr is given twice in --set"),
]


@pytest.mark.parametrize("args,message", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_the_command_line_refuses_malformed_settings(args, message, capsys, tmp_path,
                                                      compiles):
  out = tmp_path / "out"
  assert cli.main(["run", "fedrep-fig3", "--quick", *args, "--out", str(out)]) == 2
  error = capsys.readouterr().err
  assert error.count("\n") == 1 and re.match(r"fedjax-rep: error: " + message, error), error
  assert compiles.count == 0 and not out.exists()


def test_the_issues_grid_exits_2_from_the_shell(tmp_path):
  """`fedjax-rep run --grid lr=0.1,,0.2` as a process: exit status 2, one line, no --out."""
  run = subprocess.run([sys.executable, "-m", "fedjax_rep", "run", "fedrep-fig3", "--quick",
                        "--grid", "lr=0.1,,0.2", "--out", "out"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
  assert run.returncode == 2 and not run.stdout, run
  assert run.stderr == ("fedjax-rep: error: --grid lr=0.1,,0.2: an empty value between two "
                        "commas; give one or more distinct values of lr, each a number in "
                        "(0, inf), separated by single commas\n")
  assert not os.listdir(tmp_path)


@hypothesis.settings(max_examples=8, deadline=None)
@hypothesis.given(st.sampled_from(["--set", "--grid"]).flatmap(
    lambda option: st.tuples(st.just(option), malformed(option))))
def test_generated_malformed_strings_never_run(case):
  """Through `cli.main` on fedrep-fig3 (the grammar's fields renamed to its own): exit 2,
  one line, no --out."""
  option, (item, fault) = case
  key = item.partition("=")[0].strip()
  if fault == "repeated" and option == "--set" and key == "sizes":
    return  # a list may repeat a value
  if fault not in KEY_FAULTS:
    item = {"sizes": "num_clients", "mode": "data_mode", "modes": "algorithms",
            "decay": "noise_std"}.get(
        key, key) + item[len(key):]
  with tempfile.TemporaryDirectory() as directory, contextlib.redirect_stderr(io.StringIO()) as err:
    out = os.path.join(directory, "out")
    assert cli.main(["run", "fedrep-fig3", "--quick", option, item, "--out", out]) == 2, item
    assert not os.path.exists(out)
  assert err.getvalue().startswith("fedjax-rep: error: ") and err.getvalue().count("\n") == 1


# The data constructors: every shape, length and dtype relation of their arguments, checked
# before anything is indexed, for numpy and jax arrays alike (`a` converts each array).
RNG = np.random.default_rng(0)
XS, YS = RNG.normal(size=(40, 2, 2)).astype(np.float32), RNG.integers(0, 5, 40)
XT, YT = RNG.normal(size=(12, 2, 2)).astype(np.float32), RNG.integers(0, 5, 12)
PARTS, TEST_PARTS = np.split(np.arange(40), 4), np.split(np.arange(12), 4)
N, M, D = 6, 4, 5
X, Y = RNG.normal(size=(N, M, D)).astype(np.float32), RNG.normal(size=(N, M)).astype(np.float32)
KEY = jax.random.key(0)


def datasets(a, **change):
  """client_datasets of the base split (4 clients, 5 classes) with arguments changed."""
  args = {"x": XS, "y": YS, "parts": PARTS, "x_test": XT, "y_test": YT,
          "test_parts": TEST_PARTS, "num_classes": 5, **change}
  arrays = {k: a(v) if k in ("x", "y", "x_test", "y_test") else v for k, v in args.items()}
  arrays["parts"] = [a(p) for p in arrays["parts"]]
  return fr.client_datasets(**arrays)


def problem(**change):
  return fr.LinearProblem(B_star=np.linalg.qr(RNG.normal(size=(D, 2)))[0].astype(np.float32),
                          W_star=np.ones((N, 2), np.float32),
                          noise_std=np.float32(0.1)).replace(**change)


def a_stack(a, *changes):
  """stack of the base ClientDatasets and copies with fields changed."""
  base = datasets(a)
  return fr.stack_datasets([base] + [base.replace(**change) for change in changes])


CONSTRUCTORS = [
    ("y shorter than x (the issue)", lambda a: datasets(a, y=YS[:30]),
     r"^client_datasets: y has shape \(30,\) but x has shape \(40, 2, 2\): pass y \[N\] with "
     r"one label per row of x \[N, \.\.\.\]$"),
    ("y of two axes", lambda a: datasets(a, y=YS[:, None]), r"y has shape \(40, 1\) but x"),
    ("x a scalar", lambda a: datasets(a, x=np.float32(1)), r"y has shape \(40,\) but x has "
                                                           r"shape \(\)"),
    ("y_test shorter than x_test", lambda a: datasets(a, y_test=YT[:10]),
     r"y_test has shape \(10,\) but x_test has shape \(12, 2, 2\)"),
    ("x_test of other features", lambda a: datasets(a, x_test=XT.reshape(12, 4)),
     r"x_test has shape \(12, 4\) but x has shape \(40, 2, 2\): pass x_test \[T, 2, 2\]"),
    ("float labels", lambda a: datasets(a, y=YS + 0.5), r"y has dtype float\d+: labels must be "
                                                        r"integers \(class indices in \[0, "
                                                        r"num_classes=5\)\)"),
    ("a label outside the classes", lambda a: datasets(a, y=np.where(np.arange(40) == 7, 5, YS)),
     r"y\[7\] = 5 is not a class in \[0, num_classes=5\)"),
    ("a negative test label", lambda a: datasets(a, y_test=np.where(np.arange(12) == 2, -1, YT)),
     r"y_test\[2\] = -1 is not a class"),
    ("num_classes 0", lambda a: datasets(a, num_classes=0),
     r"client_datasets: num_classes must be an integer >= 1, got 0"),
    ("x, y shorter than the parts", lambda a: datasets(a, x=XS[:30], y=YS[:30]),
     r"parts\[3\]\[0\] = 30 is out of range: row indices into x, y \(30 rows\) must be in "
     r"\[0, 30\)"),
    ("a negative row index", lambda a: datasets(a, parts=[np.arange(-1, 9)] + PARTS[1:]),
     r"parts\[0\]\[0\] = -1 is out of range"),
    ("a test index out of range", lambda a: datasets(a, test_parts=TEST_PARTS[:3] + [
        np.array([11, 12])]), r"test_parts\[3\]\[1\] = 12 is out of range: row indices into "
                              r"x_test, y_test \(12 rows\)"),
    ("float row indices", lambda a: datasets(a, parts=[PARTS[0], PARTS[1] + 0.0] + PARTS[2:]),
     r"parts\[1\] has shape \(10,\) and dtype float\d+: each part must be a 1-D array of "
     r"integer row indices"),
    ("a part of two axes", lambda a: datasets(a, parts=[PARTS[0].reshape(2, 5)] + PARTS[1:]),
     r"parts\[0\] has shape \(2, 5\)"),
    ("one index array for parts", lambda a: datasets(a, parts=np.arange(4),
                                                     test_parts=np.arange(4)),
     r"parts\[0\] has shape \(\)"),
    ("fewer test parts", lambda a: datasets(a, test_parts=TEST_PARTS[:3]),
     r"client_datasets: 4 train parts but 3 test parts: pass one index array of each per "
     r"client"),
    ("no parts", lambda a: datasets(a, parts=[], test_parts=[]),
     r"client_datasets: parts is empty: pass one index array per client"),
    ("every part empty", lambda a: datasets(a, parts=[np.arange(0)] * 4),
     r"every part of parts is empty: the clients need training rows"),
    ("size below the largest part", lambda a: datasets(a, size=5),
     r"size = 5 is less than the 10 rows of parts\[0\]: pass size >= 10, or None"),
    ("size not an integer", lambda a: datasets(a, size=12.5),
     r"client_datasets: size must be an integer >= 1, got 12.5"),
    ("size 0", lambda a: datasets(a, size=0), r"size must be an integer >= 1, got 0"),
    ("test_size below the largest test part", lambda a: datasets(a, test_size=2),
     r"test_size = 2 is less than the 3 rows of test_parts\[0\]"),
    ("test_size negative", lambda a: datasets(a, test_size=-1),
     r"test_size must be an integer >= 0, got -1"),
    ("stack of nothing", lambda a: fr.stack_datasets([]),
     r"stack takes a non-empty list of ClientDatasets \(e.g. one per seed\); got none"),
    ("stack of one ClientDatasets", lambda a: fr.stack_datasets(datasets(a)),
     r"stack takes a non-empty list of ClientDatasets .*; got one ClientDatasets"),
    ("stack of other data", lambda a: fr.stack_datasets([datasets(a), fr.client_data(X, Y)]),
     r"stack: datasets\[1\] is a FixedData, not a ClientDatasets"),
    ("stack of other client counts", lambda a: fr.stack_datasets([datasets(a), datasets(
        a, parts=PARTS[:3], test_parts=TEST_PARTS[:3])]),
     r"stack: datasets\[1\] has clients 3 but datasets\[0\] has 4: stack datasets of the same "
     r"clients"),
    ("stack of other inputs", lambda a: fr.stack_datasets([datasets(a), datasets(
        a, x=XS.reshape(40, 4), x_test=XT.reshape(12, 4))]),
     r"datasets\[1\] has input shape \(4,\) but datasets\[0\] has \(2, 2\)"),
    ("stack of other dtypes", lambda a: fr.stack_datasets([datasets(a), datasets(
        a, x=XS.astype(np.float16), x_test=XT.astype(np.float16))]),
     r"datasets\[1\] has input dtype float16 but datasets\[0\] has float32"),
    ("stack of other classes", lambda a: fr.stack_datasets([datasets(a), datasets(
        a, num_classes=6)]), r"datasets\[1\] has num_classes 6 but datasets\[0\] has 5"),
    ("stack of an inconsistent dataset", lambda a: a_stack(a, {"y": a(np.zeros((4, 9), int))}),
     r"stack: datasets\[1\]: y has shape \(4, 9\) but x \(4, 10, 2, 2\) needs \(4, 10\)"),
    ("client_data: X of two axes", lambda a: fr.client_data(a(X[..., 0]), a(Y)),
     r"client data must be X \[clients, samples, dim\] and y \[clients, samples\]; got X "
     r"\(6, 4\) and y \(6, 4\)"),
    ("client_data: y of other clients", lambda a: fr.client_data(a(X), a(Y[:5])),
     r"got X \(6, 4, 5\) and y \(5, 4\)"),
    ("client_data: X_test alone", lambda a: fr.client_data(a(X), a(Y), X_test=a(X)),
     r"pass both X_test and y_test, or neither"),
    ("client_data: X_test of another dim", lambda a: fr.client_data(
        a(X), a(Y), X_test=a(X[..., :3]), y_test=a(Y)),
     r"test data must be X_test \[6, samples, 5\] and y_test \[6, samples\]; got \(6, 4, 3\)"),
    ("client_data: y_test of other samples", lambda a: fr.client_data(
        a(X), a(Y), X_test=a(X), y_test=a(Y[:, :2])), r"got \(6, 4, 5\) and \(6, 2\)"),
    ("client_data: B_star of another dim", lambda a: fr.client_data(
        a(X), a(Y), B_star=a(np.eye(4, 2))), r"B_star must be \[dim=5, rep_dim >= 1\]; got "
                                             r"\(4, 2\)"),
    ("client_data: B_star of no columns", lambda a: fr.client_data(
        a(X), a(Y), B_star=a(np.zeros((5, 0)))), r"B_star must be .*; got \(5, 0\)"),
    ("client_data: counts of other clients", lambda a: fr.client_data(
        a(X), a(Y), counts=a(np.full(5, 2))),
     r"counts must be \[clients=6\] integers in \[1, samples=4\]; got shape \(5,\) and "
     r"dtype int"),
    ("client_data: fractional counts", lambda a: fr.client_data(
        a(X), a(Y), counts=a(np.full(6, 2.5))), r"counts must be \[clients=6\] integers .*; "
                                                r"got shape \(6,\) and dtype float"),
    ("client_data: a count above the samples", lambda a: fr.client_data(
        a(X), a(Y), counts=a(np.array([4, 4, 5, 4, 4, 4]))), r"got counts\[2\] = 5 \(client 2\)"),
    ("client_data: zero clients", lambda a: fr.client_data(a(X[:0]), a(Y[:0])),
     r"num_clients \(X\.shape\[0\]\) = 0 is out of range"),
    ("make_fixed_data: 0 samples", lambda a: fr.make_fixed_data(KEY, problem(), 0),
     r"make_fixed_data: samples must be an integer >= 1, got 0"),
    ("make_fixed_data: negative test samples", lambda a: fr.make_fixed_data(
        KEY, problem(), 3, -2), r"make_fixed_data: test_samples must be an integer >= 0, got -2"),
    ("make_fixed_data: heads of another rank", lambda a: fr.make_fixed_data(
        KEY, problem(W_star=a(np.ones((N, 3), np.float32))), 3),
     r"the problem must have B_star \[dim, k\*\] and W_star \[clients, k\*\] .*; got \(5, 2\), "
     r"\(6, 3\) and \(\)"),
    ("make_fixed_data: noise_std of one per client", lambda a: fr.make_fixed_data(
        KEY, problem(noise_std=a(np.full(N, 0.1))), 3), r"a scalar noise_std; got .* and \(6,\)"),
    ("make_fixed_data: no clients", lambda a: fr.make_fixed_data(
        KEY, problem(W_star=a(np.ones((0, 2), np.float32))), 3),
     r"num_clients \(W_star\.shape\[0\]\) = 0 is out of range"),
    ("make_problem: rep_dim above dim", lambda a: fr.make_problem(KEY, N, 3, 4, 0.1),
     r"rep_dim = 4 is out of range: it must be in \[1, 3\] \(3 = dim\)"),
    ("make_problem: no clients", lambda a: fr.make_problem(KEY, 0, D, 2, 0.1),
     r"make_problem: num_clients must be an integer >= 1, got 0"),
    ("make_problem: fractional dim", lambda a: fr.make_problem(KEY, N, 2.5, 2, 0.1),
     r"make_problem: dim must be an integer >= 1, got 2.5"),
    ("make_problem: negative noise", lambda a: fr.make_problem(KEY, N, D, 2, a(-0.1)),
     r"noise_std = -0.1\d* is out of range: it must be >= 0"),
    ("make_problem: NaN noise", lambda a: fr.make_problem(KEY, N, D, 2, a(np.nan)),
     r"noise_std = nan is not finite"),
    ("make_models: no clients", lambda a: fr.make_models(KEY, 0, D),
     r"make_models: num_clients must be an integer >= 1, got 0"),
    ("make_models: an unknown spectrum", lambda a: fr.make_models(KEY, N, D, "flat"),
     r"spectrum must be one of \('linear', 'geometric', 'gaussian'\), got 'flat'"),
    ("make_underparam_data: models of one axis", lambda a: fr.make_underparam_data(
        KEY, a(np.ones(D)), 2, 3, 0.1), r"make_data: models must be \[clients >= 1, dim >= 1\] "
                                        r".*; got shape \(5,\)"),
    ("make_underparam_data: rep_dim above dim", lambda a: fr.make_underparam_data(
        KEY, a(np.ones((N, D))), D + 1, 3, 0.1), r"rep_dim = 6 is out of range: it must be in "
                                                 r"\[1, 5\]"),
    ("make_underparam_data: 0 samples", lambda a: fr.make_underparam_data(
        KEY, a(np.ones((N, D))), 2, 0, 0.1), r"make_data: samples must be an integer >= 1"),
    ("make_underparam_data: pad_to below the samples", lambda a: fr.make_underparam_data(
        KEY, a(np.ones((N, D))), 2, 5, 0.1, pad_to=3),
     r"pad_to = 3 is out of range: it must be >= 5"),
    ("make_underparam_data: negative noise", lambda a: fr.make_underparam_data(
        KEY, a(np.ones((N, D))), 2, 3, a(-1.0)), r"noise_std = -1.0 is out of range"),
]


@pytest.mark.parametrize("array", [np.asarray, jnp.asarray], ids=["numpy", "jax"])
@pytest.mark.parametrize("call,message", [case[1:] for case in CONSTRUCTORS],
                         ids=[case[0] for case in CONSTRUCTORS])
def test_a_malformed_dataset_is_a_one_line_error_naming_the_argument(call, message, array,
                                                                     compiles):
  """Nothing compiles after the inputs are made (jnp.asarray may compile a conversion)."""

  def made(value):
    value = array(value)
    compiles.reset()
    return value

  compiles.reset()
  with pytest.raises(ValueError, match=message) as error:
    call(made)
  assert "\n" not in str(error.value)
  assert compiles.count == 0, compiles.names


def test_well_formed_datasets_build_as_before():
  """The base inputs of the table build (numpy and jax alike)."""
  for a in (np.asarray, jnp.asarray):
    data = datasets(a)
    assert data.x.shape == (4, 10, 2, 2) and data.x_test.shape == (4, 3, 2, 2)
    np.testing.assert_array_equal(data.y[1], YS[10:20])
    assert fr.stack_datasets([data, datasets(a, size=12)]).x.shape == (2, 4, 12, 2, 2)
    assert fr.client_data(a(X), a(Y), counts=a(np.full(N, 2))).counts.dtype == jnp.int32
    assert fr.make_fixed_data(KEY, problem(), 3, 0).X.shape == (N, 3, D)
    empty = datasets(a, parts=[[], *PARTS[1:]], test_parts=[[], *TEST_PARTS[1:]])
    assert empty.counts.tolist() == [0, 10, 10, 10] and empty.test_counts[0] == 0
