"""Reusable L3 constructs: one concern each, props in, resources out."""
