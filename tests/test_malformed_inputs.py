"""Malformed input refused before any work: the --set / --grid grammar (property tests on
generated strings, and through the command line) and the shapes and lengths of the data
constructors (a table of bad inputs)."""

import contextlib
import dataclasses
import io
import os
import re
import tempfile

import pytest

from fedjax_rep import cli
from fedjax_rep.recipes import config as cfg

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
FEW = hypothesis.settings(max_examples=60, deadline=None)


@dataclasses.dataclass(frozen=True)
class Grammar:
  """One field of each kind the grammar parses."""
  lr: float = cfg.lr(0.1)
  rounds: int = cfg.rounds(5)
  sizes: tuple = cfg.positive_int("a list of sizes", (1, 2), sequence=True)
  mode: str = cfg.choice("a choice", "fixed", ("fixed", "fresh", "population"))
  decay: float | None = cfg.optional_nonnegative_float("auto or a number >= 0")
  devices: int | str = cfg.setting(1, cfg.Check(int, low=1, words=("all",)), "a word too")


CONFIG = Grammar()
FIELDS = [f.name for f in dataclasses.fields(Grammar)]

# Values of each field as (text, value): written in the ways the grammar takes.
floats = st.floats(1e-6, 1e6)
VALUES = {
    "lr": st.one_of(floats.map(lambda v: (repr(v), v)),
                    floats.map(lambda v: (f"{v:.3e}", float(f"{v:.3e}")))),
    "rounds": st.integers(1, 10 ** 6).flatmap(lambda n: st.sampled_from(
        [(str(n), n), (f"{n}.0", n), (f"+{n}", n)])),
    "sizes": st.integers(1, 999).map(lambda n: (str(n), n)),
    "mode": st.sampled_from(["fixed", "fresh", "population"]).map(lambda w: (w, w)),
    "decay": st.one_of(st.just(("auto", None)), floats.map(lambda v: (repr(v), v))),
    "devices": st.one_of(st.just(("all", "all")), st.integers(1, 64).map(lambda n: (str(n), n))),
}
SPACE = st.sampled_from(["", " ", "  "])


@st.composite
def well_formed(draw, option):
  """(item, key, intended values): KEY=V1,V2,... with spaces around items and distinct
  values (one value for --set of a single-valued field)."""
  key = draw(st.sampled_from(FIELDS))
  several = option == "--grid" or key == "sizes"
  pairs = draw(st.lists(VALUES[key], min_size=1, max_size=4 if several else 1,
                        unique_by=lambda pair: pair[1]))
  text = ",".join(draw(SPACE) + item + draw(SPACE) for item, _ in pairs)
  return f"{key}={text}", key, tuple(value for _, value in pairs)


@FEW
@hypothesis.given(well_formed("--set"))
def test_well_formed_settings_parse_to_their_values(case):
  item, key, values = case
  got = getattr(cfg.override(CONFIG, [item]), key)
  assert got == (values if key == "sizes" else values[0])


@FEW
@hypothesis.given(well_formed("--grid"))
def test_well_formed_grids_parse_to_their_values(case):
  item, key, values = case
  assert cfg.parse_grid(CONFIG, [item]) == {key: values}


BAD_ITEMS = {"lr": ["fast", "1_000", "0x10", "1 2", "0.1;0.2", "--1", "1e", ".", "0,1.5.2"],
             "rounds": ["2.5", "three", "1e-1", "nan", "inf", "1e400"],
             "sizes": ["0.5", "a", "-"], "mode": ["streaming", "FIXED"], "decay": ["AUTO", "x"],
             "devices": ["any", "1.5"]}


@st.composite
def malformed(draw, option):
  """(item, what is wrong): a well-formed item broken in one way."""
  item, key, values = draw(well_formed(option))
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
  several = option == "--grid" or key == "sizes"
  if several and option == "--grid":  # a value twice: refused in a grid
    return f"{key}={text},{items[draw(st.integers(0, len(items) - 1))]}", fault
  return f"{key}={text},{text}", fault  # --set: more than one value, or fine for a list


KEY_FAULTS = ("no equals", "no key", "unknown key")  # the message names the option, not a key


def refused(option, item) -> str:
  """The ConfigError message of `option` item, or '' where it parses."""
  try:
    if option == "--set":
      cfg.override(CONFIG, [item])
    else:
      cfg.parse_grid(CONFIG, [item])
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
  assert option == "--grid" or key == "sizes" or len(items) == 1, item
  assert option != "--grid" or len(set(items)) == len(items), item
  words = {"mode": ("fixed", "fresh", "population"), "decay": ("auto",), "devices": ("all",)}
  for t in items:
    assert t in words.get(key, ()) or re.fullmatch(
        r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?|[+-]?(nan|inf|infinity)", t, re.I), item


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
    cfg.parse_grid(CONFIG, grid)


# The cases and each kind of fault, through the command line: exit 2, one line
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
    item = {"sizes": "num_clients", "mode": "data_mode", "decay": "noise_std"}.get(
        key, key) + item[len(key):]
  with tempfile.TemporaryDirectory() as directory, contextlib.redirect_stderr(io.StringIO()) as err:
    out = os.path.join(directory, "out")
    assert cli.main(["run", "fedrep-fig3", "--quick", option, item, "--out", out]) == 2, item
    assert not os.path.exists(out)
  assert err.getvalue().startswith("fedjax-rep: error: ") and err.getvalue().count("\n") == 1
