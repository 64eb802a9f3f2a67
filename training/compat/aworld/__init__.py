"""AWorld's names (docs/aworld.md): its chat agent, agent config and model config.
"""
