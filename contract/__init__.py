"""What the training image, the Lambda handlers, the stacks and the tools share: the run layout, the execution
state, the job configuration, the instance catalog, metrics, checkpoints and their ledger, goodput, hang records.

Imports no other package of this repository, and not torch: every layer above reads it, on machines with and
without a GPU stack (tests/test_imports.py holds the layers).
"""
