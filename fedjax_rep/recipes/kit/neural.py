"""What the neural recipes share: configuration fields (`Training`), the words of their
titles, their data (every run's datasets with config's validation split, `stacked_datasets`;
the registered datasets and their models, `data.datasets`) and their programs: the
algorithms with config's structure and conventions, trained by the batch runner (rows and
summaries: `summaries`)."""

import dataclasses
import math

import jax
import numpy as np

from fedjax_rep.core.cohort import cohort_size
from fedjax_rep.data import datasets as datasets_lib
from fedjax_rep.data import federated
from fedjax_rep.data import new_clients as new_clients_lib
from fedjax_rep.data import partition as partition_lib
from fedjax_rep.data import validation
from fedjax_rep.nn import contract as nn_contract
from fedjax_rep.nn import conventions as conventions_lib
from fedjax_rep.nn import cost as cost_lib
from fedjax_rep.nn import hparams as hparams_lib
from fedjax_rep.nn import models
from fedjax_rep.nn import new_clients as nn_new_clients
from fedjax_rep.nn import program as program_lib
from fedjax_rep.nn import algorithms as nn_algorithms
from fedjax_rep.nn import sharded as nn_sharded
from fedjax_rep.experiments import config as cfg
from fedjax_rep.experiments import placement
from fedjax_rep.privacy import accountant as privacy_accountant
from fedjax_rep.nn import privacy as privacy_mechanism
from fedjax_rep.recipes.kit import shared
from fedjax_rep.recipes.kit import summaries

# The fields a grid sweeps in one program.
TRACED = ("lr", "momentum", "weight_decay", "dp_noise", "dp_clip")
DEFAULT_CLIP = 1.0  # user-level DP's dp_clip where DP is asked for without it
DEFAULT_ALGORITHMS = ("fedrep", "fedper", "lg-fedavg", "fedavg", "fedavg-ft", "local")


def dataset(default, help="the data: any registered dataset (fedjax-rep list; yours with "
            "fr.register_dataset), those with files once prepared (fedjax-rep data)"):
  """The `dataset` field: a dataset registered in `data.datasets` (a --plugin file's too)."""
  return cfg.choice(help, default, datasets_lib.names)


def partition(default="classes"):
  return cfg.choice("how samples are split over clients: S class shards each (FedRep's), "
                    "Dirichlet label proportions, or iid", default,
                    tuple(partition_lib.PARTITIONS))


def classes_per_client(default):
  return cfg.positive_int("classes per client S (partition=classes)", default)


def dirichlet_alpha(default=0.5):
  return cfg.positive_float("concentration alpha of the Dirichlet label proportions "
                            "(partition=dirichlet)", default)


def local_epochs(default=1):
  return cfg.positive_int("local epochs per round (FedRep: of the body)", default)


def head_epochs(default=10):
  return cfg.positive_int("FedRep's head epochs per round, before the body epochs; also "
                          "FedAvg-FT's fine-tuning epochs", default)


def batch_size(default=10):
  return cfg.positive_int("minibatch size of local SGD", default)


def momentum(default=0.5):
  return cfg.setting(default, cfg.Check(float, low=0.0, high=1.0, open_high=True),
                     "heavy-ball momentum of local SGD")


def weight_decay(default=1e-4):
  return cfg.nonnegative_float("L2 weight decay of local SGD", default)


def eval_every(default=5):
  return cfg.positive_int("evaluate test accuracy every this many rounds (and after the "
                          "last)", default)


def eval_clients(default="all"):
  return cfg.choice("whom each evaluation tests: every client (FedRep's code) or only the "
                    "clients that trained in the round before it", default,
                    nn_contract.EVAL_CLIENTS)


def summary_statistic(default="last10"):
  return cfg.choice(f"the statistic of each run's test accuracies that summary.csv, table1.csv "
                    f"and the figure report, then averaged over seeds: the mean of the last "
                    f"{summaries.LAST_EVALUATIONS} evaluations (the papers'; all where fewer), "
                    f"the last evaluation, or the best (with a validation split: the test "
                    f"accuracy at the round of the best validation accuracy)", default,
                    summaries.STATISTICS)


def validation_fraction(default=0.0):
  return cfg.setting(default, cfg.Check(float, low=0.0, high=1.0, open_high=True),
                     "fraction of each client's training samples held out for validation "
                     "(0: none); evaluations then also report val_accuracy, `best` picks the "
                     "round by it and --select the grid's combination")


def new_clients(default=0.0):
  return cfg.nonnegative_float("clients held out of training, chosen by the seed: a fraction "
                               "in [0, 1) of them or a whole number; each evaluation also "
                               "tests them after `new_epochs` epochs of adaptation "
                               "(new_accuracy; docs/neural.md says how each method adapts)",
                               default)


def new_epochs(default=10):
  return cfg.positive_int("epochs each new client adapts on its own training split before "
                          "it is tested (new_clients)", default)


def dp_epsilon(default=None):
  return cfg.setting(default, cfg.Check(float, low=0.0, open_low=True, optional=True,
                                        auto="none: DP only where dp_noise is given"),
                     "user-level DP: the ε to spend over the run's rounds; calibrates the "
                     "noise multiplier dp_noise with the accountant (needs pip install "
                     "'.[privacy]'; docs/neural.md)")


def dp_noise(default=None):
  return cfg.setting(default, cfg.Check(float, low=0.0, optional=True,
                                        auto="none, or calibrated to dp_epsilon"),
                     "user-level DP: the noise multiplier (Gaussian noise of std dp_noise x "
                     "dp_clip on the sum of the cohort's clipped updates); the ε it spends "
                     "is reported (dp_epsilon in metrics.csv)")


def dp_clip(default=None):
  return cfg.setting(default, cfg.Check(float, low=0.0, open_low=True, optional=True,
                                        auto=f"{DEFAULT_CLIP:g} where DP is asked for"),
                     "user-level DP: the L2 norm each sampled client's update of the "
                     "shared parameters is clipped to")


def dp_delta(default=None):
  return cfg.setting(default, cfg.Check(float, low=0.0, high=1.0, open_low=True,
                                        open_high=True, optional=True,
                                        auto="1 / n^1.1, n the training clients"),
                     "user-level DP: the δ of (ε, δ)")


def dp_sampling(default="cohort"):
  return cfg.choice("user-level DP: how a round's clients are drawn, as the accountant "
                    "accounts it: cohort (a fixed-size cohort, uniformly without "
                    "replacement) or poisson (each client with probability cohort / n, "
                    "truncated to the cohort)", default, privacy_accountant.SAMPLINGS)


def dp_accountant(default=None):
  return cfg.setting(default, cfg.Check(str, choices=privacy_accountant.ACCOUNTANTS,
                                        optional=True,
                                        auto="pld where it accounts the sampling (poisson, "
                                             "or full participation), else rdp"),
                     "user-level DP: dp-accounting's accountant, pld or rdp")


def client_group(default=10):
  return cfg.positive_int("clients trained together in one vmap (groups run one after "
                          "another: memory vs speed)", default)


def precision(default="float32"):
  return cfg.choice("the neural forward and backward passes in float32 (every matmul and "
                    "convolution at full float32, on every backend), tf32 (JAX's default "
                    "matmul precision: TF32 on NVIDIA GPUs) or bfloat16 (bf16: mixed "
                    "precision; the params, gradients and optimiser state stay float32)",
                    default, tuple(models.PRECISIONS))


def conventions(default=conventions_lib.PAPER):
  return cfg.choice("training conventions: the papers' text, or the authors' code (FedRep's "
                    "and FLUTE's; each knob below, auto here, can change one of them; "
                    "docs/neural.md lists them)", default, tuple(conventions_lib.PRESETS))


def convention(knob: str, default=None):
  """The configuration field of one knob of `nn.conventions` (None: auto, the preset's)."""
  return cfg.setting(default, cfg.Check(str, choices=conventions_lib.KNOBS[knob],
                                        optional=True, auto="as `conventions` says"),
                     conventions_lib.HELP[knob])

def precision_record(config, swept: cfg.Sweep) -> dict:
  """What config.json records of config's `precision` (`nn.models.precision_record`):
  {"precision": {"name": ..., "matmul": "highest"|"default"|"bfloat16"}}, or a list of them,
  one per value, where the grid sweeps it."""
  if "precision" in swept.grid:
    return {"precision": [models.precision_record(p) for p in swept.grid["precision"]]}
  return {"precision": models.precision_record(config.precision)}


def registered() -> tuple[str, ...]:
  """The names of the neural algorithms registered now (the package's, then a plugin's)."""
  return tuple(nn_algorithms.ALGORITHMS)


def algorithms(default=DEFAULT_ALGORITHMS):
  """The algorithms to compare: any registered neural algorithm, those of --plugin files
  too (default: DEFAULT_ALGORITHMS)."""
  return cfg.choice("algorithms to compare", default, registered, sequence=True)


@dataclasses.dataclass(frozen=True)
class Training(cfg.Config):
  """The configuration fields of every neural recipe's training: FedRep's schedule
  (Section 5.2: r = 0.1, 10 head epochs + `local_epochs` body epochs, SGD lr 0.01 with
  momentum 0.5 and weight decay 1e-4, batch 10, 100 rounds), evaluation and seeds. A
  recipe's Config derives from it, adds its data fields and may change defaults."""
  rounds: int = cfg.rounds(100)
  participation: float = cfg.participation(0.1)
  local_epochs: int = local_epochs()
  head_epochs: int = head_epochs()
  batch_size: int = batch_size()
  lr: float = cfg.lr(0.01, "step size of local SGD")
  momentum: float = momentum()
  weight_decay: float = weight_decay()
  eval_every: int = eval_every()
  eval_clients: str = eval_clients()
  validation_fraction: float = validation_fraction()
  new_clients: float = new_clients()
  new_epochs: int = new_epochs()
  dp_epsilon: float | None = dp_epsilon()
  dp_noise: float | None = dp_noise()
  dp_clip: float | None = dp_clip()
  dp_delta: float | None = dp_delta()
  dp_sampling: str = dp_sampling()
  dp_accountant: str | None = dp_accountant()
  summary: str = summary_statistic()
  seed: int = cfg.seed()
  client_group: int = client_group()
  precision: str = precision()
  conventions: str = conventions()
  feature_penalty: str | None = convention("feature_penalty")
  flute_star_order: str | None = convention("flute_star_order")
  starting_heads: str | None = convention("starting_heads")
  bias_decay: str | None = convention("bias_decay")
  averaging: str | None = convention("averaging")
  options: tuple = dataclasses.field(default=(), metadata={
      "help": "(name, value) of each traced option given as a key (`declared_options`)"})

  def record(self, swept: cfg.Sweep) -> dict:
    """What config.json records of the training conventions (`nn.conventions`):
    {"conventions": {"preset": "paper"|"authors", knob: value, ...}}, every knob resolved
    (under a grid, one such entry per combination, under its label); of the algorithms'
    options: {"options": {name: value}}, every option `declared_options` has, at the value
    the configuration sets or else its default ("auto" where the algorithm computes it; a
    grid's values are under "grid"); of the precision (`precision_record`); and with
    user-level DP, under "privacy", `privacy_record` (per combination under a grid)."""
    record = lambda c: {"preset": c.conventions, **resolved_conventions(c).described()}
    conventions = (dict(zip(swept.labels, map(record, swept.configs))) if swept.grid
                   else record(self))
    given = dict(self.options)
    options = {name: given.get(name, "auto" if option.default is None else option.default)
               for name, option in sorted(self.declared_options().items())}
    private = self.privacy_records(swept)
    return {"conventions": conventions, "options": options, **precision_record(self, swept),
            **({"privacy": private} if private else {})}

  def privacy_records(self, swept: cfg.Sweep) -> dict:
    """config.json's "privacy" of this configuration under the sweep `swept`: its
    `privacy_record` (under a grid, one per private combination, under its label); {}
    without DP."""
    private = {label: privacy_record(c) for label, c in
               zip(swept.labels, swept.configs) if c.private()}
    return privacy_record(self) if private and not swept.grid else private

  def declared_options(self) -> dict[str, hparams_lib.Option]:
    """{name: Option} of the traced options that the algorithms in `algorithms` declare,
    less those a recipe sets itself (`set_by_recipe`: the conventions' flags, the epoch
    counts of `nn.program`); --set and --grid take them as keys."""
    entries = [nn_algorithms.ALGORITHMS[name] for name in self.algorithms
               if name in nn_algorithms.ALGORITHMS]
    return {o.name: o for entry in entries for o in entry.options
            if not o.set_by_recipe}

  def shard_refusal(self, name: str) -> str | None:
    """None when the neural algorithm `name` can run sharded, else why not
    (`nn.sharded.refusal`)."""
    return nn_sharded.refusal(nn_algorithms.CLASSES[name])

  def private(self) -> bool:
    """Whether this configuration asks for user-level DP (dp_epsilon, dp_noise or
    dp_clip)."""
    return any(v is not None for v in (self.dp_epsilon, self.dp_noise, self.dp_clip))

  def check_privacy(self) -> None:
    """ConfigError (one line) where DP is asked for and dp_epsilon and dp_noise are both
    given, an algorithm cannot be privatised (`nn.privacy.refusal`), the conventions
    make the server average personal parameters, the clients are sharded, or the
    accountant cannot account the sampling (`privacy.accountant.accountant_for`); or where
    dp_delta, dp_sampling or dp_accountant is given without DP."""
    if not self.private():
      for name, what in (("dp_delta", "the δ"), ("dp_sampling", "the sampling"),
                         ("dp_accountant", "the accountant")):
        if getattr(self, name) != getattr(Training, name):
          raise cfg.ConfigError(f"{name} is {what} of user-level DP: give dp_epsilon (or "
                                f"dp_noise) too, or leave {name} out")
      return
    if self.dp_epsilon is not None and self.dp_noise is not None:
      raise cfg.ConfigError("give dp_epsilon (which calibrates the noise multiplier) or "
                            "dp_noise (whose ε is reported), not both")
    for name in self.algorithms:  # (a recipe's own names, e.g. srpfl-neural's: its refusal)
      kind = nn_algorithms.CLASSES.get(name)
      why = kind and privacy_mechanism.refusal(kind)
      if why is not None:
        raise cfg.ConfigError(f"{name} cannot run under user-level DP: {why}; leave it out "
                              f"of algorithms")
    if resolved_conventions(self).starting_heads == "averaged":
      raise cfg.ConfigError("user-level DP: starting_heads=averaged makes the server average "
                            "personal parameters; give --set starting_heads=initial (or "
                            "conventions=paper)")
    if self.devices != 1:
      raise cfg.ConfigError("user-level DP runs on one device: give devices=1")
    if (sizes := dp_sizes(self)) is not None:
      try:
        privacy_accountant.accountant_for(self.dp_sampling, *sizes, self.dp_accountant)
      except ValueError as error:
        raise cfg.ConfigError(f"user-level DP: {error}") from None


def resolved_conventions(config) -> conventions_lib.Conventions:
  """The `nn.conventions` of `config` (a `Training`): its preset `conventions` with the
  knobs it sets."""
  fields = vars(config)
  return conventions_lib.resolve(config.conventions,
                                 **{knob: fields[knob] for knob in conventions_lib.KNOBS})


def options_text(config) -> str:
  """A figure title's words for the traced options config sets and its user-level DP
  settings, e.g. ", server_beta=0.9, dp_epsilon=1" (empty where it sets none)."""
  private = [(name, getattr(config, name)) for name in ("dp_epsilon", "dp_noise", "dp_clip")
             if getattr(config, name) is not None]
  return "".join(f", {name}={value if isinstance(value, str) else format(value, 'g')}"
                 for name, value in (*config.options, *private))


def conventions_text(config) -> str:
  """A figure title's words for config's conventions: "authors' conventions" or "paper
  conventions", and the knobs that differ from that preset, e.g. "authors' conventions
  (averaging=samples)"."""
  preset = conventions_lib.PRESETS[config.conventions]
  resolved = resolved_conventions(config)
  changed = [f"{knob}={getattr(resolved, knob)}" for knob in conventions_lib.KNOBS
             if getattr(resolved, knob) != getattr(preset, knob)]
  words = "authors' conventions" if config.conventions == conventions_lib.AUTHORS else (
      "paper conventions")
  return words + (f" ({', '.join(changed)})" if changed else "")


def hparams(config) -> hparams_lib.NNHparams:
  """The traced hyperparameters of `config`: lr, momentum, weight decay, and the algorithms'
  traced options that config sets in its `options` (--set NAME=VALUE; the conventions'
  flags, which depend on the algorithm, are `shared_program`'s)."""
  return hparams_lib.hparams(config.lr, config.momentum, config.weight_decay,
                             **dict(config.options))


def stacked_datasets(config, runs: list[dict], dataset):
  """The clients of every run, as every neural recipe builds them: dataset(run) (one run's
  ClientDatasets or FlatClients) for each run of `runs` (dicts of its metrics.csv columns,
  'seed' among them), each with config's per-client validation split (`data.validation.split`
  of config.validation_fraction, drawn from run['seed']; none where the fraction is 0) and
  laid out for config's devices (`placement.laid_out`), stacked along a leading run axis
  (`federated.stack`: x [runs, n, ...]). With config.new_clients, a `WithNewClients`: the
  new clients of each run (`data.new_clients.split`, chosen by run['seed']) held out before
  the validation split, stacked apart, the training clients as above."""
  prepared = lambda data, seed: placement.laid_out(
      validation.split(data, config.validation_fraction, seed), config)
  if not config.new_clients:
    return federated.stack([prepared(dataset(run), run["seed"]) for run in runs])
  parts = []
  for run in runs:
    data = dataset(run)
    try:
      count = new_clients_lib.count(config.new_clients, data.num_clients)
    except ValueError as error:
      raise cfg.ConfigError(str(error)) from None
    parts.append(new_clients_lib.split(data, count, run["seed"]))
  return nn_new_clients.WithNewClients(
      train=federated.stack([prepared(train, run["seed"]) for (train, _), run in
                             zip(parts, runs)]),
      new=federated.stack([new for _, new in parts]))


def training_clients(data):
  """The clients that train of a recipe's `data` (`stacked_datasets`): all of them, or a
  `WithNewClients`' training clients."""
  return data.train if isinstance(data, nn_new_clients.WithNewClients) else data


def training_count(config, num_clients: int) -> int:
  """How many of a run's num_clients clients train (the cohort is a share of these): all
  but config's new clients (`data.new_clients.count`)."""
  return num_clients - new_clients_lib.count(config.new_clients, num_clients)


def with_new_clients(program, config, data):
  """`program` as it runs on `data`: where data hold new clients (`WithNewClients`), it
  trains on the others and each evaluation tests the new clients after config.new_epochs
  epochs of adaptation (`nn.new_clients.NewClients`)."""
  if isinstance(data, nn_new_clients.WithNewClients):
    return nn_new_clients.NewClients(program, config.new_epochs)
  return program


def check_dataset(name: str, files: bool = True) -> None:
  """Before any work: DataMissing (naming the command that prepares them) where registered
  dataset `name` reads files that are missing (files=False: only where it has no mock to
  stand in for them), ConfigError where it names a model that `nn.models` lacks."""
  entry = datasets_lib.lookup(name)
  if files or entry.mock is None:
    datasets_lib.require(name)
  if entry.model is not None and entry.model not in models.MODELS:
    raise cfg.ConfigError(f"dataset {name} names model {entry.model!r}, which is none of "
                          f"{', '.join(models.MODELS)}: register it with one of them, or "
                          f"model=None (chosen by its input shape)")


def dataset_model(name: str, input_shape, precision: str, model: str | None = None):
  """The Classifier for registered dataset `name` with inputs of shape input_shape (one
  example): `model` (None: the dataset's own, else the one its input shape picks,
  `models.model_for`) with the dataset's num_classes outputs, at `precision`."""
  entry = datasets_lib.lookup(name)
  chosen = model or entry.model or models.model_for(input_shape)
  return models.make_model(chosen, entry.num_classes, precision=precision)


def algorithm(name, config, model, num_clients):
  """Algorithm `name` with its structure, placement (devices, cohort groups), whom it
  evaluates (eval_clients) and the structure of its conventions (FLUTE*'s order) from
  `config`, for num_clients clients."""
  return nn_algorithms.make_algorithm(
      name, model=model, cohort=cohort_size(num_clients, config.participation),
      local_epochs=config.local_epochs, head_epochs=config.head_epochs,
      batch_size=config.batch_size, client_group=config.client_group,
      ft_epochs=config.head_epochs, head_first=resolved_conventions(config).head_first(),
      eval_clients=config.eval_clients, **placement.keywords(config))


def shared_program(config, own, own_hparams, peers, data) -> tuple:
  """`program.program`'s (program, hparams) of algorithm `own` among `peers`, the hparams
  with the flags of config's conventions that the program takes (`Conventions.options`),
  and of config's options only those the program declares (`hparams.declared`); data: the
  runs' ClientDatasets (x [runs, n, m, ...])."""
  example = data.input_spec(runs=1)  # one input, not sliced
  program, program_hparams = program_lib.program(own, own_hparams, peers, example)
  declared = hparams_lib.declared(program)
  return program, program_hparams.replace(options={
      **{k: v for k, v in program_hparams.options.items() if k in declared},
      **resolved_conventions(config).options(program)})


def traced_keys(config) -> tuple[str, ...]:
  """The keys of `config` that a grid sweeps inside one program (`Recipe.traced`): lr,
  momentum, weight_decay and the traced options its algorithms declare."""
  return (*TRACED, *config.declared_options())


def trained(batch, unit_name, name, config, model, data, keys, num_clients, grid=None,
            runs=None) -> list[dict]:
  """Algorithm `name` (`algorithm`) trained for config.rounds rounds on every run of `data`
  (R runs, keys [R]), once per combination of `grid` (dicts of traced keys, `traced_keys`;
  None: config's own values), by `batch` (`batch.Batch.train`, units `unit_name...`): a
  list of results in the grid's order, each with its `cost` (COST: `nn.cost` of the
  algorithm itself, flops_per_round at config's values, a cached unit). Run by the
  program that it shares with the others of config.algorithms (`nn.program`), when there
  are any (one compilation for all of them), with the flags of config's conventions that
  the program takes; where data hold new clients (`with_new_clients`), num_clients counts
  them too and the algorithm's cohort is a share of the others. The grid's combinations
  are the candidates a batch's search may stop early (`experiments.search`). `runs`: the metrics.csv
  columns of each run of `data` (seed, settings), with which the tracker logs them as they
  compute."""
  members = [[{"algorithm": name, **run, **combination} for run in runs]
             for combination in grid or [{}]] if runs else None
  training = training_clients(data)
  num_clients = training_count(config, num_clients)
  peers = [algorithm(n, config, model, num_clients) for n in config.algorithms]
  own = algorithm(name, config, model, num_clients)
  settings = [cfg.apply(config, combination) for combination in grid or [{}]]
  private = [privacy(s, num_clients, own.cohort) for s in settings]
  programs = [shared_program(s, own, with_options(hparams(s), p), peers, data)
              for s, p in zip(settings, private)]
  results = batch.train(unit_name, with_new_clients(programs[0][0], config, data), data,
                        [h for _, h in programs], keys, config.rounds,
                        eval_every=config.eval_every, members=members,
                        searched=grid is not None)
  for result, s, p in zip(results, settings, private):
    if p:
      spent = privacy_accountant.epsilons(p["dp_noise"], num_clients, own.cohort,
                                          list(np.asarray(result["eval_rounds"])),
                                          delta(s, num_clients), **sampling(s))
      runs_count = next(iter(result["eval"].values())).shape[0]
      result["eval"]["dp_epsilon"] = np.tile(np.asarray(spent, np.float64), (runs_count, 1))
  flops = batch.unit(f"{unit_name}-flops", lambda: {"flops_per_round": np.float64(
      cost_lib.round_flops(own, training, hparams(config)))})["flops_per_round"]
  return [{**result, "cost": {**cost_lib.communication(own, training, hparams(s)),
                              "flops_per_round": float(flops)}}
          for result, s in zip(results, settings)]


def with_options(given: hparams_lib.NNHparams, options: dict) -> hparams_lib.NNHparams:
  """`given` with `options` added to (or replacing) its options."""
  return given.replace(options={**given.options, **options})


def delta(config, num_clients: int) -> float:
  """config's dp_delta, else `privacy.accountant.default_delta` of the num_clients
  training clients."""
  return (privacy_accountant.default_delta(num_clients) if config.dp_delta is None
          else config.dp_delta)


def privacy(config, num_clients: int, cohort: int) -> dict:
  """The DP options of config's runs on num_clients training clients in cohorts of
  `cohort` ({} without DP): dp_clip (given, else DEFAULT_CLIP), dp_noise (given, else
  calibrated by the accountant so that config.rounds rounds spend dp_epsilon at `delta`
  under config's sampling, else 0: clipping alone) and, for Poisson sampling, the flag
  dp_poisson."""
  if not config.private():
    return {}
  noise = config.dp_noise
  if noise is None:
    noise = (privacy_accountant.calibrate(config.dp_epsilon, num_clients, cohort,
                                          config.rounds, delta(config, num_clients),
                                          **sampling(config))
             if config.dp_epsilon is not None else 0.0)
  clip = DEFAULT_CLIP if config.dp_clip is None else config.dp_clip
  poisson = {privacy_mechanism.POISSON.name: 1.0} if config.dp_sampling == "poisson" else {}
  return {privacy_mechanism.CLIP.name: float(clip), privacy_mechanism.NOISE.name: float(noise),
          **poisson}


def dp_sizes(config) -> tuple[int, int] | None:
  """(n, cohort): config's training clients and the clients a round draws of them, where
  its num_clients is one number; None where the recipe has several settings (Table 1's)
  or computes it (0)."""
  clients = getattr(config, "num_clients", None)
  if not isinstance(clients, int) or clients <= 0:
    return None
  n = training_count(config, clients)
  return n, cohort_size(n, config.participation)


def sampling(config) -> dict:
  """The accountant's keywords for config's sampling: {"sampling", "accountant"}."""
  return {"sampling": config.dp_sampling, "accountant": config.dp_accountant}


def privacy_record(config) -> dict:
  """What config.json records of config's user-level DP (`privacy.accountant.record`: the
  mechanism, accountant, sampling, noise multiplier used (calibrated or given), clip, δ
  and the ε spent over its rounds), for its num_clients; where the recipe has several
  (Table 1's settings), the noise is calibrated per setting: the target and the rule."""
  if (sizes := dp_sizes(config)) is None:
    return {"dp_epsilon": config.dp_epsilon, "noise_multiplier": "calibrated per setting",
            "dp_delta": config.dp_delta or "1 / n^1.1"}
  n, cohort = sizes
  options = privacy(config, n, cohort)
  noise, clip = options[privacy_mechanism.NOISE.name], options[privacy_mechanism.CLIP.name]
  spent = privacy_accountant.epsilon(noise, n, cohort, config.rounds, delta(config, n),
                                     **sampling(config))
  recorded = privacy_accountant.record(noise, clip, delta(config, n), spent,
                                       calibrated=config.dp_epsilon is not None,
                                       num_clients=n, cohort=cohort, **sampling(config))
  return {**recorded, "epsilon": spent if math.isfinite(spent) else "inf (no noise)"}


def run_keys(seed_values, repeats: int = 1) -> jax.Array:
  """The run keys [repeats * seeds] of seeds `seed_values` (consecutive), as every recipe
  derives them; run i * seeds + j has seed j's key."""
  index = np.tile(np.arange(len(seed_values)), repeats)
  return shared.run_keys(shared.seed_keys(seed_values[0], len(seed_values)), index)


def runs(result, start: int, stop: int) -> dict:
  """The runs start..stop-1 of a `trained` result (eval_rounds and cost are shared)."""
  pick = lambda tree: jax.tree.map(lambda a: np.asarray(a)[start:stop], tree)
  return {"metrics": pick(result["metrics"]), "eval_rounds": result["eval_rounds"],
          "eval": pick(result["eval"]), **({"cost": result["cost"]} if "cost" in result else {})}


