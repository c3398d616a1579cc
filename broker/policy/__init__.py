"""Placement policy: what a job should run on next (used by the reconciler and the simulator)."""
