"""What every training backend's job handlers share: their environments, the progress a poll records (checkpoints
in the run's ledger, goodput, metrics) and the end-of-run prune."""
