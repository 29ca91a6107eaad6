"""Neural personalised federated learning on the round engine.

A neural algorithm is a frozen dataclass deriving from `algorithm.Personalized`, which
does the round: sample a cohort, train every client locally (one `vmap` over groups of
`client_group` clients, `train.sgd_epochs`: padded datasets, masked steps, optax SGD),
average the shared parameters weighted by sample counts (`core.aggregate`; uniformly
under the authors' conventions, `conventions.py`), keep every client's personal
parameters (stacked [n, ...], sampled or not), and `evaluate` each client on its own test
set. Parameters are flat dicts split by a label tree (`params.py`): which are shared,
which personal.

To add an algorithm, derive from `Personalized` (or a method close to yours) and override
the hooks you need (`labels`, `client_update`, `server_update`, `eval_params`, the state's
`initial_parts` and `initial_server`), declare its traced options (`options`) and register
it with `core.registry.register` (`fr.register_algorithm`): docs/api.md's "Adding an
algorithm" works two examples through.
"""
