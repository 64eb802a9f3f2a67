"""Example agents, environments and tasks. Each trains on the built-in tiny model with no download.

Importing the package registers the example datasets: ``frozenlake``, ``copy``, ``countdown``.
"""

from examples import copy_task, countdown_workflow, frozenlake  # noqa: F401
