"""Approval gates: store a request with its task token; decide it through an IAM-authorised URL."""
