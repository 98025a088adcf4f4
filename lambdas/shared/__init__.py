"""Pure, dependency-free modules shared by the handlers and by the CDK app at synth time."""
