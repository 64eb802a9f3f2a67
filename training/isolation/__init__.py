"""Running what we do not trust: the jail (``jail``), the sandbox for model-written programs
(``sandbox``), other Python interpreters (``interpreters``) and the egress guard (``egress``).
"""
