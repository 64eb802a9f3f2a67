"""Backends on a remote training service that speaks Tinker's protocol: what they share (``service``),
the tinker and fireworks backends, and the names of rLLM's remote trainers' configs (``rllm_names``).
"""
