"""The flat public API of fedjax_rep (`import fedjax_rep as fr; fr.FedRep`): importing
this module imports every family (linear, neural, recipes) and registers their algorithms.
"""

from fedjax_rep.core.aggregate import weighted_mean, weighted_sum
from fedjax_rep.core.cohort import cohort_size, sample_cohort
from fedjax_rep.core.compile_cache import enable as enable_compile_cache
from fedjax_rep.core.threefry import use_flat as use_flat_threefry
from fedjax_rep.core.loop import Chunk, RunResult, evaluate, init_state, run
from fedjax_rep.core.padding import Padded, PaddedData
from fedjax_rep.core.protocols import (Algorithm, Checked, ClassificationData, ClientData,
                                      Evaluated, MaskedAlgorithm)
from fedjax_rep.core.registry import ALGORITHMS
from fedjax_rep.data import digits
from fedjax_rep.data.datasets import DATASETS
from fedjax_rep.data.datasets import register as register_dataset
from fedjax_rep.data.federated import ClientDatasets, client_datasets
from fedjax_rep.data.federated import stack as stack_datasets
from fedjax_rep.data.flat import FlatClients, flat_clients
from fedjax_rep.data.partition import PARTITIONS, partition
from fedjax_rep.data.new_clients import split as new_clients_split
from fedjax_rep.data.validation import split as validation_split
from fedjax_rep.core.tree import gather, scatter, stack
from fedjax_rep.hetero.speeds import SpeedModel, dynamic_speeds, fixed_speeds, given_speeds
from fedjax_rep.hetero.timed import (Timed, TimedHparams, TimedState, fixed_participants,
                                     srpfl_participants)
from fedjax_rep.hetero.timed import hparams as timed_hparams
from fedjax_rep.linear.fedavg import (FedAvg, GlobalState, fine_tuned_models, global_grad_norm,
                                      local_gd, model_loss_and_grad)
from fedjax_rep.linear.fedrep import FedRep, RepState, mean_rep_gradient
from fedjax_rep.linear.flute import Flute, regularizer, regularizer_grads
from fedjax_rep.linear.heads import fit_models, head_gd, least_squares, solve_spd
from fedjax_rep.linear.hparams import LinearHparams
from fedjax_rep.linear.init import init_representation, method_of_moments
from fedjax_rep.linear.memory import check as check_memory
from fedjax_rep.linear.memory import estimate as estimate_memory
from fedjax_rep.linear.local import fine_tune_error, local_models, new_client_error
from fedjax_rep.linear.metrics import mean_squared_error, model_error, principal_angle
from fedjax_rep.linear.data_modes import (FixedData, FreshData, PopulationData, Targets,
                                          client_data, make_fixed_data)
from fedjax_rep.linear.problem import LinearProblem, make_problem, sample, sample_clients
from fedjax_rep.linear.underparam import make_models, rank_k_error, spectrum, top_subspace
from fedjax_rep.linear.underparam import make_data as make_underparam_data
from fedjax_rep.linear.algorithms import make_algorithm
from fedjax_rep.nn.algorithm import NNState, Personalized
from fedjax_rep.nn.conventions import resolve as nn_conventions
from fedjax_rep.nn.hparams import NNHparams, Option
from fedjax_rep.nn.hparams import hparams as nn_hparams
from fedjax_rep.nn.models import MODELS, make_model
from fedjax_rep.nn.new_clients import NewClients, WithNewClients
from fedjax_rep.nn.algorithms import make_algorithm as make_neural_algorithm
from fedjax_rep.nn.algorithms import register as register_algorithm
from fedjax_rep.nn.state import RoundInfo
from fedjax_rep.experiments.config import ConfigError
from fedjax_rep.experiments.recipe_registry import all_recipes as _all_recipes
from fedjax_rep.experiments.recipe_registry import resolve
from fedjax_rep.experiments.runner import run as run_recipe
from fedjax_rep.experiments.runner import run_to_dir

RECIPES = _all_recipes()  # every recipe by name, in listing order
