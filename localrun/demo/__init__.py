"""`make demo`: the whole pipeline run locally (`python -m localrun.demo`), its teams scenarios and its report."""
