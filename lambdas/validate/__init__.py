"""Validate an execution input into a complete, resolved training request."""
