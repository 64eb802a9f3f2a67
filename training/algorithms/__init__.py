"""The RL arithmetic the backends share: advantage estimators (``advantages``), loss recipes
(``recipes``) and episodes turned into training rows (``episode_rows``).
"""
