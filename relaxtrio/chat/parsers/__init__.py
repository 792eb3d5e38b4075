"""Output parsers: reasoning blocks, tool calls, and the assistant message built from them.

Pure Python (no transformers, no torch). Decoding needs only an object with
``decode(ids) -> str`` such as :class:`relaxtrio.chat.compiler.ChatCompiler`.
"""

from ._json import canonical_arguments as canonical_arguments
from .assistant import DecodedAssistant as DecodedAssistant
from .assistant import FinishReason as FinishReason
from .assistant import FinishType as FinishType
from .assistant import TokenDecoder as TokenDecoder
from .assistant import decode_assistant as decode_assistant
from .assistant import effective_finish_type as effective_finish_type
from .reasoning import REASONING_PARSERS as REASONING_PARSERS
from .reasoning import UnclosedThinkPolicy as UnclosedThinkPolicy
from .reasoning import parse_reasoning as parse_reasoning
from .tool_calls import TOOL_CALL_PARSERS as TOOL_CALL_PARSERS
from .tool_calls import ParsedToolCall as ParsedToolCall
from .tool_calls import RejectedToolCall as RejectedToolCall
from .tool_calls import ToolCallParse as ToolCallParse
from .tool_calls import call_id_for as call_id_for
from .tool_calls import check_tool_call_parser as check_tool_call_parser
from .tool_calls import parse_tool_calls as parse_tool_calls
from .tool_calls import parse_tool_calls_detailed as parse_tool_calls_detailed
from .tool_calls import resolve_tool_call_parser as resolve_tool_call_parser
from .tool_calls import tool_call_id as tool_call_id

__all__ = [
    "REASONING_PARSERS",
    "TOOL_CALL_PARSERS",
    "DecodedAssistant",
    "FinishReason",
    "FinishType",
    "ParsedToolCall",
    "RejectedToolCall",
    "TokenDecoder",
    "ToolCallParse",
    "UnclosedThinkPolicy",
    "call_id_for",
    "canonical_arguments",
    "check_tool_call_parser",
    "decode_assistant",
    "effective_finish_type",
    "parse_reasoning",
    "parse_tool_calls",
    "parse_tool_calls_detailed",
    "resolve_tool_call_parser",
    "tool_call_id",
]
