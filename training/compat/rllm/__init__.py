"""rLLM's names (docs/rllm.md): its library agents, tools and environments, MCP environment,
inference engines, evaluators and SFT trainer.
"""
