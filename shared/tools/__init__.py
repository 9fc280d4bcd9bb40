"""Tools: the protocol, the registry, built-ins, inline HTTP tools and the SSRF guard.

Importing the package registers the built-in tools (``calculator``, ``current_time``,
``http_get``, ``stop``, ``run_python``, ``save_note``, ``knowledge_search``, ``remember``,
``recall``); plugins come from
the ``treadle.tools`` entry-point group.
"""

from shared.tools import builtins as builtins
from shared.tools import knowledge as knowledge
from shared.tools import memory as memory
from shared.tools import notes as notes
from shared.tools import sandbox as sandbox
from shared.tools.base import (
    FunctionTool,
    InvalidToolArguments,
    KnowledgeSource,
    MemorySource,
    Tool,
    ToolContext,
    ToolFunction,
    ToolResult,
    json_schema_of,
    validation_message,
)
from shared.tools.http_tool import HttpTool, fill_url
from shared.tools.netguard import SafeResponse, check_url, deny_reason, safe_request
from shared.tools.registry import (
    ENTRY_POINT_GROUP,
    REGISTRY,
    Registry,
    get,
    load_entry_points,
    resolve,
    tool,
    tool_defs,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "REGISTRY",
    "FunctionTool",
    "HttpTool",
    "InvalidToolArguments",
    "KnowledgeSource",
    "MemorySource",
    "Registry",
    "SafeResponse",
    "Tool",
    "ToolContext",
    "ToolFunction",
    "ToolResult",
    "check_url",
    "deny_reason",
    "fill_url",
    "get",
    "json_schema_of",
    "load_entry_points",
    "resolve",
    "safe_request",
    "tool",
    "tool_defs",
    "validation_message",
]
