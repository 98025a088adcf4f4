"""Run the synthesized platform offline: the pipeline in moto's Step Functions engine, training locally."""
