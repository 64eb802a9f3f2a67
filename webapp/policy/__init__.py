"""The run policy, below the registry and the runs: what a run may ask (limits), which keys only
the platform sets, and the sandboxed check of a run's spec. Knows no registry row and no run."""
