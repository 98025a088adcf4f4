"""Custom resource that builds the training image in CodeBuild during `cdk deploy`."""
