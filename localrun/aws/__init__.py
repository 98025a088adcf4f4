"""The emulated AWS: the synthesized platform deployed into moto, IAM enforced, and what moto leaves out played
here (CloudFormation's resolution, service behaviours, the decision URL, handler environments, time)."""
