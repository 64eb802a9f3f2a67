"""The TRL backend (``backend``) and TRL's GRPOConfig names, a dialect of the config (``names``).
"""
