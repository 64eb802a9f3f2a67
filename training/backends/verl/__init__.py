"""The verl backend (``backend``), its agent loop (``agent_loop``) and verl's config keys (``names``).
"""
