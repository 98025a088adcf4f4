"""Capacity fallback: the next attempt's cluster after insufficient capacity."""
