"""The training backends, played on this machine: SageMaker training and tuning jobs, AWS Batch multi-node jobs,
the teams' queue, and scripted job histories; each runs the image's own entrypoint on local hosts."""
