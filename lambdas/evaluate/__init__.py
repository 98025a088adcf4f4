"""Compare a finished job's final metrics with the run's quality gate."""
