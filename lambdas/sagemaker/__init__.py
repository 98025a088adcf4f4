"""The SageMaker backend's handlers: the training job's monitor, its cleanup, and the capacity fallback."""
