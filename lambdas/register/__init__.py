"""Register the trained model with its lineage in the model package group."""
