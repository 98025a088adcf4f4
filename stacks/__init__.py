"""The platform's CDK stacks (`*_stack.py`), their reusable constructs and the settings model."""
