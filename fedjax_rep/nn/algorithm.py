"""The neural round: a cohort trains locally (one vmap over client groups), the server
averages the shared parameters, every client keeps its personal ones.

`Personalized` is the base of every neural algorithm: its fields are structure (the model,
cohort size, epochs, batch size, client group size, placement), its `NNHparams` traced,
with the options it declares (`options`, a tuple of `hparams.Option`). A subclass
overrides some hooks (docs/api.md, "Adding an algorithm"): `labels(flat)` (which params
are shared, which personal); `initial_parts(flat)`, `initial_server(shared, personal)`
(the starting state); `client_update(shared, personal, x, y, count, key, hparams, info)`
-> (what it sends, new personal params, mean loss); `server_update(shared, sent, weights,
hparams, info)` -> (new shared params, new server state); `eval_params(...)` (the params a client
is tested with). `info` (`RoundInfo`) carries the round index, the server state and the
number of clients. What a round costs (`cost`): `server_sent` (the server state sent to
clients) and `exchanged` (what a round moves outside the hooks). Sharding: `sharded`;
evaluation: `evaluation`; conventions: `conventions`; checks: `contract`.
"""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn
from optax import tree_utils as otu

from fedjax_rep.core import aggregate
from fedjax_rep.core import cohort as cohort_lib
from fedjax_rep.core import sharding
from fedjax_rep.core import tree
from fedjax_rep.nn import contract
from fedjax_rep.nn import conventions
from fedjax_rep.nn import evaluation
from fedjax_rep.nn import hparams as hparams_lib
from fedjax_rep.nn import params as params_lib
from fedjax_rep.nn import sharded
from fedjax_rep.nn.hparams import NNHparams
from fedjax_rep.nn.model_steps import ModelSteps
from fedjax_rep.nn.state import NNState, RoundInfo
from fedjax_rep.nn import privacy



@dataclasses.dataclass(frozen=True)
class Personalized(ModelSteps):
  """Base of the neural algorithms (see the module docstring).

  model: a `models.Classifier` (params {'body', 'head'}); cohort: clients per round;
  local_epochs: epochs of local training (FedRep: of the body, after its head epochs);
  batch_size: minibatch size; client_group: clients trained together in one vmap (None:
  the whole cohort at once); cohort_groups: draw the cohort stratified over this many
  contiguous equal groups of clients (None: uniformly, or one group per device when
  sharded); devices: shard the client axis over the first `devices` devices (`sharded`;
  None: unsharded); eval_clients: whom `evaluate` tests, every client ("all", as FedRep's
  code) or only the last round's cohort ("cohort").
  """
  model: nn.Module
  cohort: int
  local_epochs: int = 1
  batch_size: int = 10
  client_group: int | None = 10
  name: str = "personalized"
  cohort_groups: int | None = None
  devices: int | None = None
  eval_clients: str = "all"
  # Traced options all read (`hparams.Option`; subclasses add theirs): two conventions'
  # flags and user-level differential privacy's (`nn.privacy`).
  options: ClassVar[tuple] = (conventions.FLAGS["no_bias_decay"],
                              conventions.FLAGS["uniform_average"], *privacy.OPTIONS)
  # Whether `server_update`, where overridden, is an average of what the clients send,
  # which the DP mechanism may replace by its private mean (`nn.privacy.refusal`).
  private_server: ClassVar[bool] = False
  # Compile the loop's programs for compile time on the CPU (`core.loop.QUICK_COMPILE`).
  quick_compile: ClassVar[bool] = True
  # The metric the loop's blow-up bound watches (`core.protocols.Algorithm`): train_loss.
  tracked_metric: ClassVar[str | None] = None
  # The keys of the server state (`initial_server`) that the server sends every sampled
  # client with the shared params, because its `client_update` reads them (SCAFFOLD's
  # control variate); the others (e.g. momentum) stay on the server (`cost.communication`).
  server_sent: ClassVar[tuple[str, ...]] = ()
  # The epoch field that this class also reads as a traced option of that name
  # (`hparams.FT_EPOCHS`, `hparams.HEAD_EPOCHS`: how many of those epochs run), so that
  # its variants that differ only in it share one program (`program.program`); None: none.
  traced_epochs: ClassVar[str | None] = None

  # -- the hooks ---------------------------------------------------------------------------
  def labels(self, flat: dict) -> dict:
    """{path: params.SHARED or params.PERSONAL} of every param of `flat` (default: the body
    shared, the head personal)."""
    return params_lib.head_personal(flat)

  def initial_parts(self, flat: dict) -> tuple[dict, dict]:
    """(shared, one client's personal) parts of the state for initial model params `flat`."""
    return params_lib.split(flat, self.labels(flat))

  def initial_server(self, shared: dict, personal: dict) -> dict:
    """The initial server state (a pytree; default: empty) for the initial shared params
    and one client's initial personal params (`initial_parts`)."""
    del shared, personal
    return {}

  def client_update(self, shared: dict, personal: dict, x, y, count, key, hparams,
                    info: RoundInfo):
    """One client's local training: (what it sends, its new personal params, its mean
    loss []). `shared` is the server's, `personal` the client's; x [m, ...], y [m], count
    real rows. Default: `local_epochs` of SGD on all parameters at once, sending the new
    shared params."""
    del info
    flat = params_lib.merge(shared, personal)
    trained, loss = self.sgd(self.loss, flat, x, y, count, key, hparams, self.local_epochs)
    return (*params_lib.split(trained, self.labels(trained)), loss)

  def server_update(self, shared: dict, sent, weights: jax.Array, hparams: NNHparams,
                    info: RoundInfo):
    """(new shared params, new server state) from what the cohort sent (`client_update`'s
    first output, leaves [c, ...]) with weights [c] (sample counts, 0 for masked clients).
    Default: the weighted mean (`cohort_sum`; unchanged if no weight), the server state
    carried through."""
    del hparams
    sums, total = self.cohort_sum(sent, weights)
    return otu.tree_where(total > 0, aggregate.mean(sums, total), shared), info.server

  def shared_leaves(self, hparams: NNHparams) -> dict | None:
    """{leaf of what `client_update` sends: bool or bool []}, the leaves a client really
    shares (the DP mechanism clips and noises only those); None: every leaf it sends."""
    del hparams
    return None

  def eval_params(self, shared: dict, personal: dict, x, y, count, key, hparams) -> dict:
    """The flat params a client is tested with (default: shared + its personal ones)."""
    del x, y, count, key, hparams
    return params_lib.merge(shared, personal)

  def exchanged(self, shared: dict, personal: dict, hparams: NNHparams) -> tuple:
    """(up, down, share): what a sampled client uploads and downloads in a round besides
    `client_update`'s `sent`, the shared params and the `server_sent` server state, as
    pytrees of arrays or shapes (`shared` the server's, `personal` one client's), and the
    share of rounds that exchange them (1.0: every round; a number, from one run's
    `hparams`). For `cost.communication`; a round that moves params outside the hooks says
    so here. Default: nothing."""
    del shared, personal, hparams
    return {}, {}, 1.0

  # -- what the lower modules ask ------------------------------------------------------
  @classmethod
  def overrides(cls, hook: str) -> bool:
    """Whether this class (or a base below `Personalized`) overrides the method `hook`."""
    return getattr(cls, hook) is not getattr(Personalized, hook)

  def option(self, hparams: NNHparams, name: str):
    """The value of the option `name` that this algorithm declares (`options`): hparams'
    (traced, float32 []; a choice's index) where present, else its Option's default (a
    Python float, as a constant; None where the algorithm computes it)."""
    option = hparams_lib.declared(self)[name]
    if name in hparams.options or option.default is None:
      return hparams.options.get(name)
    return option.number(option.default)

  def program_member(self, flat: dict):
    """The choices (`partial.Member`, Python values) with which this algorithm runs as a
    member of the traced program of `partial.PartialSharing` for params `flat` (or their
    shapes); None (the default): not a member."""
    del flat
    return None

  # -- the algorithm ---------------------------------------------------------------------
  def check(self, data, hparams: NNHparams) -> None:
    """The checks of a run, before anything compiles: the data's own, 1 <= cohort <=
    num_clients, the sharding (a flat store laid out for its devices), hparams' options and
    this algorithm's hooks (`contract.check`)."""
    sharded.check_data(self, data)
    contract.check(self, data, hparams)
    sharded.check(self, data.num_clients)
    if privacy.active(hparams):
      why = privacy.run_refusal(self, data.num_clients, hparams)
      if why is not None:
        raise ValueError(f"{self.name} cannot run under user-level DP (dp_clip): {why}")

  def init(self, key, data, hparams: NNHparams) -> NNState:
    """The model's initial params (one draw: every client starts from the same model),
    every client untrained where the option average_untrained is given, no client in the
    last cohort with eval_clients="cohort"; laid out on the client mesh when sharded."""
    sharded.check(self, data.num_clients)
    key_model, key_eval = jax.random.split(key)
    spec = data.input_spec()
    sample = jnp.zeros((1, *spec.shape), spec.dtype)
    flat = params_lib.flatten(self.model.init(key_model, sample)["params"])
    shared, one_personal = self.initial_parts(flat)
    personal = jax.tree.map(lambda p: jnp.broadcast_to(p, (data.num_clients, *p.shape)),
                            one_personal)
    n = data.num_clients
    return sharded.place(self, NNState(
        shared=shared, personal=personal, eval_key=jax.random.key_data(key_eval),
        server=self.initial_server(shared, one_personal), round=jnp.zeros((), jnp.int32),
        untrained=jnp.ones(n, bool) if contract.AVERAGE_UNTRAINED in hparams.options else None,
        cohort=jnp.zeros(n, bool) if self.eval_clients == "cohort" else None))

  def round_info(self, state: NNState, num_clients: int) -> RoundInfo:
    """The `RoundInfo` of the round that starts from `state` (n = num_clients)."""
    return RoundInfo(round=state.round, server=state.server, num_clients=num_clients)

  def round(self, state: NNState, key, data, hparams: NNHparams):
    """One round: the cohort drawn from `key` (uniformly, or stratified over the cohort
    groups; under DP's Poisson sampling those of it that join, `privacy.poisson_mask`)
    trains and the server updates (`masked_round`; sharded: `sharded.round`)."""
    sharded.check(self, data.num_clients)
    key_cohort, key_clients = jax.random.split(key)
    groups = sharded.cohort_groups(self)
    if self.devices is not None:
      state, clients, weights, metrics = sharded.round(self, state, key_cohort, key_clients,
                                                       data, hparams)
      return self.finish_round(state, clients, weights, None, hparams), metrics
    clients = (cohort_lib.sample_cohort(key_cohort, data.num_clients, self.cohort)
               if groups is None else
               cohort_lib.sample_grouped(key_cohort, data.num_clients, self.cohort, groups))
    mask = privacy.poisson_mask(jax.random.fold_in(key_cohort, 1), data.num_clients,
                                self.cohort, hparams)
    return self.masked_round(state, key_clients, data, hparams, clients, mask)

  def masked_round(self, state: NNState, key, data, hparams: NNHparams, clients, mask=None):
    """One round of clients `clients` [c] where `mask` [c] (bool; None: all) is True: they
    train (client i with key fold_in(key, i)), the server updates from what they sent
    weighted by their sample counts (uniformly with the option uniform_average), and they
    keep their new personal params; masked and unsampled clients keep theirs. Metrics:
    train_loss, the weighted mean of the cohort's mean minibatch losses. Unsharded."""
    if self.devices is not None:
      raise ValueError(f"{self.name}: masked_round trains given clients on one device; with "
                       f"devices={self.devices} use round")
    info = self.round_info(state, data.num_clients)
    state, sent, weights, losses = self.train_clients(state, key, data, hparams, clients,
                                                      clients, info, mask)
    (shared, server), metrics = self.server_step(
        state.shared, sent, weights, losses, hparams, info,
        jax.random.fold_in(key, data.num_clients))  # no client's key: those fold in < n
    state = state.replace(shared=shared, server=server)
    return self.finish_round(state, clients, weights, mask, hparams), metrics

  def train_clients(self, state: NNState, key, data, hparams: NNHparams, rows, clients,
                    info: RoundInfo, mask=None):
    """Local training of the clients at rows `rows` [c] of `data` and `state.personal`,
    whose global indices are `clients` [c] (the same unless sharded; client i trains with
    key fold_in(key, i)), where `mask` [c] (bool; None: all) is True. Returns (state with
    their new personal params, what they send (leaves [c, ...]), their weights [c]
    (`conventions.client_weights`), their mean minibatch losses [c])."""
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, clients)
    old_personal = tree.gather(state.personal, rows)

    def client(args, x, y, count):
      personal, client_key = args
      return self.client_update(state.shared, personal, x, y, count, client_key, hparams,
                                info)

    sent, personal, losses = data.map_clients(client, (old_personal, keys), rows,
                                              self.client_group)
    weights = conventions.client_weights(data, rows, hparams, mask)
    if mask is not None:
      personal = jax.tree.map(
          lambda new, old: jnp.where(mask.reshape(-1, *[1] * (new.ndim - 1)), new, old),
          personal, old_personal)
    state = state.replace(personal=tree.scatter(state.personal, rows, personal))
    return state, sent, weights, losses

  def server_step(self, shared: dict, sent, weights, losses, hparams, info: RoundInfo,
                  key=None):
    """((new shared params, new server state) of `server_update`, metrics: train_loss, the
    `weights`-weighted mean of the cohort's losses [c]). Under user-level DP (the option
    dp_clip, `nn.privacy`), `server_update` gets the private mean of `sent`
    (noise from `key`) as the one update of the round, and the metrics dp_clipped."""
    metrics = {"train_loss": aggregate.mean(*self.cohort_sum(losses, weights))}
    if privacy.active(hparams):
      mean, private = privacy.private_mean({p: shared[p] for p in sent}, sent, weights,
                                           self.shared_leaves(hparams), hparams,
                                           self.cohort, key)
      sent, weights = jax.tree.map(lambda a: a[None], mean), jnp.ones(1)
      metrics.update(private)
    return self.server_update(shared, sent, weights, hparams, info), metrics

  def finish_round(self, state: NNState, clients, weights, mask, hparams) -> NNState:
    """`state` after the server step of a round of clients `clients` [c] (mask [c]: those
    that trained; None: all): the round counted, untrained clients started
    (`conventions.start_untrained`) and the cohort recorded (eval_clients="cohort")."""
    state = conventions.start_untrained(state, clients, weights, mask, hparams,
                                        self.shares_params(hparams))
    state = state.replace(round=state.round + 1)
    if state.cohort is None:
      return state
    trained = jnp.ones(clients.shape, bool) if mask is None else mask
    return state.replace(cohort=jnp.zeros_like(state.cohort).at[clients].max(trained))

  def shares_params(self, hparams: NNHparams):
    """Whether the server averages any parameter (bool or bool [])."""
    del hparams
    return True

  def cohort_sum(self, values, weights: jax.Array):
    """(sum_i w_i u_i, sum_i w_i) over the whole cohort (`aggregate.weighted_sum`): values a
    pytree of leaves [c, ...], weights [c]. Sharded, each device holds its part of the
    cohort and the sums are psum'd over the devices, so every device gets the total."""
    sums = aggregate.weighted_sum(values, weights)
    return sums if self.devices is None else jax.lax.psum(sums, sharding.CLIENTS)

  def evaluate(self, state: NNState, data, hparams: NNHparams) -> dict:
    """`evaluation.evaluate`: every client (or the last cohort) tested with its own params
    (on its test set, and on its validation split where the data have one: val_*)."""
    sharded.check(self, data.num_clients)
    return evaluation.evaluate(self, state, data, hparams)

  def new_clients(self, state: NNState, data, hparams: NNHparams, key, epochs: int) -> dict:
    """`evaluation.accuracy_metrics` of new clients (`data`: their own train and test sets;
    new client i adapts with the i-th key of split(key, n)). The default, for every method
    whose server holds the whole body: each reuses the learned body (the server's, frozen)
    and fits only a head, from zero, by `epochs` epochs of SGD on its training data
    (`head_probe`: FedRep Fig. 6's and FedAvg-FT Fig. 5's test of a representation); for a
    method whose clients keep their bodies (L2GD, Fed-MTL), the mean of the clients' models
    trained whole for `epochs` epochs (`mean_model_tuned`). An algorithm that adapts
    otherwise overrides this method."""
    if all(p in state.shared for p in state.personal if p.startswith("body/")):
      adapted = self.head_probe(state, hparams, epochs)
    else:
      adapted = self.mean_model_tuned(state, hparams, epochs)
    return evaluation.new_clients(self, adapted, data, key)

  def mean_model_tuned(self, state: NNState, hparams: NNHparams, epochs: int):
    """adapted(key, x, y, count) -> flat params (`evaluation.new_clients`): the server's
    params and the mean over the clients of their personal ones, all trained for `epochs`
    epochs of SGD on the model's loss."""
    start = {**state.shared, **{p: jnp.mean(v, axis=0) for p, v in state.personal.items()}}
    start = {p: v for p, v in start.items() if p.startswith(("body/", "head/"))}
    return lambda key, x, y, count: self.sgd(self.loss, start, x, y, count, key, hparams,
                                             epochs)[0]

  def head_probe(self, state: NNState, hparams: NNHparams, epochs: int):
    """adapted(key, x, y, count) -> flat params (`evaluation.new_clients`): the server's body
    with a head trained from zero for `epochs` epochs on the frozen body's features."""
    body = {p: v for p, v in state.shared.items() if p.startswith("body/")}
    head = {p: jnp.zeros(v.shape[1:] if p in state.personal else v.shape, v.dtype)
            for p, v in {**state.shared, **state.personal}.items() if p.startswith("head/")}

    def adapted(key, x, y, count):
      return params_lib.merge(body, self.train_head(body, head, x, y, count, key, hparams,
                                                    epochs)[0])

    return adapted
