"""What talks to the web platform: the run reporter (``reporter``) and its command line (``cli``),
the pre-queue check of a run (``probe``), the artifact store (``artifacts``) and sweeps (``sweep``).
"""
