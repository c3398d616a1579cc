"""Trace simulator for placement policies (spot-sim-protocol)."""
