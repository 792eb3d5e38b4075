"""relaxtrio.train: the torch side of GRPO/PPO.

Turns scored contexts (an exported ``TrainingSample`` with its advantage, a
``relaxtrio.rollout.scored.ScoredSample``) into AdamW updates of a causal LM, and writes the new
weights where an engine can reload them. Synchronous and blocking: the trio driver calls it
through ``trio.to_thread.run_sync``.
"""

from ..config import TrainConfig as TrainConfig
from .batching import MicroBatch as MicroBatch
from .batching import SampleLike as SampleLike
from .batching import ScoredLike as ScoredLike
from .checkpoint import save_checkpoint_dir as save_checkpoint_dir
from .checkpoint import save_weights_dir as save_weights_dir
from .logprobs import entropy_from_logits as entropy_from_logits
from .logprobs import logprobs_from_logits as logprobs_from_logits
from .logprobs import token_logprobs as token_logprobs
from .loss import policy_loss as policy_loss
from .multimodal import merge_multimodal_inputs as merge_multimodal_inputs
from .multimodal import multimodal_model_inputs as multimodal_model_inputs
from .stats import TrainStats as TrainStats
from .trainer import Trainer as Trainer

__all__ = [
    "MicroBatch",
    "SampleLike",
    "ScoredLike",
    "TrainConfig",
    "TrainStats",
    "Trainer",
    "entropy_from_logits",
    "logprobs_from_logits",
    "merge_multimodal_inputs",
    "multimodal_model_inputs",
    "policy_loss",
    "save_checkpoint_dir",
    "save_weights_dir",
    "token_logprobs",
]
