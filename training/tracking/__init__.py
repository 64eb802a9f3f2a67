"""Where a run's numbers go: metric sinks (``sinks``), experiment trackers such as W&B and MLflow
(``trackers``) and the process's system metrics (``system_metrics``).
"""
