"""What a user writes an agent with: ``BaseAgent`` and ``BaseEnv`` (``base``), what an ``AgentTrainer`` is given (``spec``),
rLLM's ``Workflow`` (``workflow``) and AgentFlow decorators (``flow``), Python functions as tools (``tools``), and
the SDK a black-box agent reaches the model through (``sdk``).
"""
