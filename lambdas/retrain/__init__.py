"""Retraining on new data: one execution per quiet period of new objects under a registered prefix."""
