"""Run the synthesized platform offline, in three rooms: `aws` (the emulated AWS: moto, IAM enforced, the
state machine in moto's Step Functions engine), `backends` (each training backend played on this machine, real
training) and `demo` (`make demo`, its scenarios and its report)."""
