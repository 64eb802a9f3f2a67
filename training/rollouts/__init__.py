"""Running episodes: the turn loop (``episode_runner``), generation with the policy (``generation``,
``vllm_server``, the OpenAI-compatible ``chat_endpoint``), loading the policy (``models``, ``tiny``),
validation and inference (``validation``), and whether a run did what it claims (``outcomes``).
"""
