"""relaxtrio.forest: canonical conversations, the SessionForest, and export to TrainingSamples.

Pure and synchronous; imports only the standard library, attrs, ``relaxtrio._errors`` and
``relaxtrio._validate`` (the shared validation vocabulary, itself stdlib + attrs + errors).

* :class:`Conversation` canonicalizes a request's messages, tools and chat-template kwargs;
  :func:`state_hash` identifies a conversation state.
* :class:`SessionForest` records every committed state of a Session as observation and response
  nodes and matches a request to its longest committed prefix in one pass.
* :func:`parse_session_output` reads the agent's output file; :func:`export_samples` turns the
  exported contexts into :class:`TrainingSample` s.
"""

from ._canonical import Conversation as Conversation
from ._canonical import canonical_message as canonical_message
from ._canonical import canonical_messages as canonical_messages
from ._canonical import canonical_template_kwargs as canonical_template_kwargs
from ._canonical import canonical_tools as canonical_tools
from ._canonical import state_hash as state_hash
from ._dump import forest_to_json as forest_to_json
from ._dump import sample_from_json as sample_from_json
from ._dump import sample_leaf_hash as sample_leaf_hash
from ._dump import sample_to_json as sample_to_json
from ._export import TRACE_KEY as TRACE_KEY
from ._export import TrainingSample as TrainingSample
from ._export import export_samples as export_samples
from ._forest import SessionForest as SessionForest
from ._forest import context_length_message as context_length_message
from ._ids import LineageIds as LineageIds
from ._json import canonical_arguments as canonical_arguments
from ._memo import ConversationMemo as ConversationMemo
from ._nodes import Match as Match
from ._nodes import ObservationNode as ObservationNode
from ._nodes import ResponseNode as ResponseNode
from ._nodes import RootNode as RootNode
from ._nodes import WeightSpan as WeightSpan
from ._output import ExportRecord as ExportRecord
from ._output import SessionOutput as SessionOutput
from ._output import parse_session_output as parse_session_output
from ._policy import LeafSelection as LeafSelection
from ._policy import select_leaves as select_leaves
from ._rules import MessageRules as MessageRules

__all__ = [
    "TRACE_KEY",
    "Conversation",
    "ConversationMemo",
    "ExportRecord",
    "LeafSelection",
    "LineageIds",
    "Match",
    "MessageRules",
    "ObservationNode",
    "ResponseNode",
    "RootNode",
    "SessionForest",
    "SessionOutput",
    "TrainingSample",
    "WeightSpan",
    "canonical_arguments",
    "canonical_message",
    "canonical_messages",
    "canonical_template_kwargs",
    "canonical_tools",
    "context_length_message",
    "export_samples",
    "forest_to_json",
    "parse_session_output",
    "sample_from_json",
    "sample_leaf_hash",
    "sample_to_json",
    "select_leaves",
    "state_hash",
]
