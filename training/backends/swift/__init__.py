"""The ms-swift backend (``backend``) and the process it runs in swift's own environment (``child``).
"""
