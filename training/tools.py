"""AWorld's ``training.tools.register_tool`` and ``be_tool`` (docs/aworld.md), and its class-based
tools' names (``ToolFactory``, ``ActionFactory``, ``ToolAction``, ``ExecutableAction``, ``TemplateTool``,
``ToolActionInfo``, ``ParamInfo``, ``ActionModel``, ``ActionResult``): the code lives in
``training.agents.tools`` and ``training.compat.aworld.tools``."""

from training.agents.tools import *  # noqa: F401,F403
from training.compat.aworld.tools import (  # noqa: F401
    ActionFactory,
    ActionModel,
    ActionResult,
    AsyncBaseTool,
    AsyncTool,
    BaseTool,
    ExecutableAction,
    ParamInfo,
    TemplateTool,
    ToolAction,
    ToolActionInfo,
    ToolFactory,
    be_tool,
    function_to_tool,
)
