"""Command-line tools for people operating the platform."""
