"""Estimate a run's cost and decide whether it needs approval."""
