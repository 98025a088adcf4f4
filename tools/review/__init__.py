"""Offline review of the CloudFormation changes between a git revision and the working tree (`make review`)."""
