"""The typed run configuration: what ``python -m relaxtrio train`` runs with (no torch import).

:class:`TrainRunConfig` (:mod:`.run`) is the whole run; it composes the parts each package owns,
one module per owner:

* :mod:`.agent`: how a Session's agent process starts and stops (:class:`AgentConfig`);
* :mod:`.api`: how the agent API serves agents (:class:`ApiConfig`);
* :mod:`.rollout`: Group shape, scheduling, scoring and evaluation (:class:`RolloutConfig`,
  :class:`EvalConfig`);
* :mod:`.generation`: sampling and parsers (:class:`GenerationConfig`);
* :mod:`.fleet`: the engines, launched or connected (:class:`FleetConfig`);
* :mod:`.trainer`: optimizer, policy loss and the algorithm vocabulary (:class:`TrainConfig`);
* :mod:`.trackers`: TensorBoard / W&B (:class:`TrackerConfig`);
* :mod:`.distributed`: trainer ranks and Ray placement (:class:`DistributedConfig`).

Import the names from here (``from relaxtrio.config import FleetConfig``). The command line
(:mod:`relaxtrio.cli.train_config`) builds the run config; everything else receives it or one of
its parts, so no module reads flags or environment variables on its own.

May import: attrs, :mod:`relaxtrio._errors` and :mod:`relaxtrio._validate`. Never torch, quart or
httpx, nor any package above this one.
"""

from .agent import AGENT_TIMEOUT_S as AGENT_TIMEOUT_S
from .agent import EXPORT_POLICY_NAMES as EXPORT_POLICY_NAMES
from .agent import RESERVED_ENV_PREFIX as RESERVED_ENV_PREFIX
from .agent import TERM_GRACE_S as TERM_GRACE_S
from .agent import AgentConfig as AgentConfig
from .agent import ExportPolicyName as ExportPolicyName
from .api import DEFAULT_HEARTBEAT_S as DEFAULT_HEARTBEAT_S
from .api import DEFAULT_MAX_BODY_BYTES as DEFAULT_MAX_BODY_BYTES
from .api import ApiConfig as ApiConfig
from .distributed import WILDCARD_HOSTS as WILDCARD_HOSTS
from .distributed import DistributedConfig as DistributedConfig
from .fleet import BACKENDS as BACKENDS
from .fleet import Backend as Backend
from .fleet import FleetConfig as FleetConfig
from .fleet import WeightSync as WeightSync
from .generation import GenerationConfig as GenerationConfig
from .rollout import EvalConfig as EvalConfig
from .rollout import RolloutConfig as RolloutConfig
from .run import TrainRunConfig as TrainRunConfig
from .trackers import TrackerConfig as TrackerConfig
from .trackers import TracingConfig as TracingConfig
from .trackers import WandbMode as WandbMode
from .trainer import ADVANTAGE_ESTIMATORS as ADVANTAGE_ESTIMATORS
from .trainer import ESTIMATORS_REJECTING_CUSTOM_ADVANTAGE as ESTIMATORS_REJECTING_CUSTOM_ADVANTAGE
from .trainer import ESTIMATORS_WITH_KL_SHAPING as ESTIMATORS_WITH_KL_SHAPING
from .trainer import MULTI_CONTEXT_NEEDS_DYNAMIC_BATCHING as MULTI_CONTEXT_NEEDS_DYNAMIC_BATCHING
from .trainer import AdvantageEstimator as AdvantageEstimator
from .trainer import KlLossType as KlLossType
from .trainer import LossAggregation as LossAggregation
from .trainer import PolicyRatio as PolicyRatio
from .trainer import TrainConfig as TrainConfig

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGENT_TIMEOUT_S",
    "DEFAULT_HEARTBEAT_S",
    "DEFAULT_MAX_BODY_BYTES",
    "ESTIMATORS_REJECTING_CUSTOM_ADVANTAGE",
    "ESTIMATORS_WITH_KL_SHAPING",
    "EXPORT_POLICY_NAMES",
    "MULTI_CONTEXT_NEEDS_DYNAMIC_BATCHING",
    "RESERVED_ENV_PREFIX",
    "TERM_GRACE_S",
    "WILDCARD_HOSTS",
    "AdvantageEstimator",
    "AgentConfig",
    "ApiConfig",
    "DistributedConfig",
    "EvalConfig",
    "ExportPolicyName",
    "BACKENDS",
    "Backend",
    "FleetConfig",
    "GenerationConfig",
    "KlLossType",
    "LossAggregation",
    "PolicyRatio",
    "RolloutConfig",
    "TrackerConfig",
    "TracingConfig",
    "TrainConfig",
    "TrainRunConfig",
    "WandbMode",
    "WeightSync",
]
