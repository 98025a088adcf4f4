"""Summarise a running training job: status, spot interruptions, checkpoint freshness."""
