"""Names that exist only because other projects have them, so their code ports by its import lines:
rLLM's (``compat.rllm``) and AWorld's (``compat.aworld``).
"""
