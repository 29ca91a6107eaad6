"""Neural personalised federated learning on the round engine.

A neural algorithm is a frozen dataclass deriving from `algorithm.Personalized`, which
does the round: sample a cohort, train every client locally (one `vmap` over groups of
`client_group` clients, `train.sgd_epochs`: padded datasets, masked steps, optax SGD),
average the shared parameters weighted by sample counts (`core.aggregate`; uniformly
under the authors' conventions, `conventions.py`), keep every client's personal
parameters (stacked [n, ...], sampled or not), and `evaluate` each client on its own test
set. Parameters are flat dicts split by a label tree (`params.py`): which are shared,
which personal.

To add an algorithm, write one short file:

  @dataclasses.dataclass(frozen=True)
  class MyAlg(Personalized):
    name: str = "my-alg"

    def labels(self, flat):                 # which params the server averages
      return params.head_personal(flat)     # (or last_layers_shared(2), all_shared, ...)

    def client_update(self, shared, personal, x, y, count, key, hparams):
      ...                                   # a client's local training, from the server's
      return new_shared, new_personal, loss # `shared` and its own `personal`

    def eval_params(self, shared, personal, x, y, count, key, hparams):
      ...                                   # optional: what the client is tested with

and register it in `registry.py`. The helpers `self.sgd` (epochs of SGD on any loss of
any subset of params), `self.train_head` (head epochs on features computed once) and
`self.features` / `self.logits` / `self.head_logits` do the rest; see `fedrep.py` (two
phases), `fedavg.py` (fine-tuning before evaluation) and `lg_fedavg.py` (another split).
State beyond one model goes through `initial_parts` (Ditto, APFL: a second model per
client; SCAFFOLD: control variates) and `server_update` (SCAFFOLD's control step).
"""
