"""The local platform served on this machine's loopback, so that `tp` in another terminal works against it.

moto's server mode (its WSGI application over the very backends the platform runs in) answers on
https://127.0.0.1:<port>, with a certificate made for the address, so TLS-only bucket policies hold as on AWS;
every call is judged by local IAM (localrun/aws/iam.py) as the platform's own calls are. With it come:

- the decision URL (localrun/aws/decision_url.py);
- the pipeline stack's outputs, resolved from the assembly (the decision URL the local one), in the variables tp
  takes them from (TP_STATE_MACHINE, TP_DECISION_URL, TP_ARTIFACTS_BUCKET);
- two people, an ML engineer (`local-engineer`) and an approver (`local-approver`), each a role session with the
  permissions tp needs (`ENGINEER_ACTIONS`, `READER_ACTIONS`) in a shared credentials file;
- `env.sh`, which points a shell's tp (and any AWS SDK) at all of it: `source <folder>/env.sh`.

Only loopback is served: the credentials it accepts are the local platform's, and no one else's.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import ssl
import threading
from pathlib import Path
from typing import Any

import boto3
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

from localrun.aws.cfn import ACCOUNT, REGION
from localrun.aws.decision_url import HOST, DecisionUrl
from localrun.aws.engine import REQUESTER, LocalPlatform
from stacks import outputs as stack_outputs

ENGINEER, APPROVER = "local-engineer", "local-approver"
OUTPUT_VARIABLES = {
    "TP_STATE_MACHINE": stack_outputs.STATE_MACHINE_ARN,
    "TP_DECISION_URL": stack_outputs.DECISION_URL,
    "TP_ARTIFACTS_BUCKET": stack_outputs.ARTIFACTS_BUCKET,
}
"""tp's variables for the stack's outputs it reads (tools/tp.py's options)."""
"""The profiles of the credentials file: who `tp` is in the shell that sources env.sh (AWS_PROFILE picks)."""

READER_ACTIONS = {
    "stage": ["cloudformation:DescribeStacks"],
    "runs": ["states:ListExecutions"],
    "executions": ["states:DescribeExecution", "states:GetExecutionHistory"],
    "jobs": [
        "sagemaker:DescribeTrainingJob",
        "sagemaker:ListTrainingJobsForHyperParameterTuningJob",
        "batch:DescribeJobs",
    ],
    "logs": ["logs:DescribeLogStreams", "logs:GetLogEvents", "logs:FilterLogEvents"],
    "records": ["s3:ListBucket", "s3:GetObject", "kms:Decrypt"],
    "self": ["iam:ListRoleTags"],
}
"""What `tp` reads of a stage (list, watch, logs, show, cost, check), by what it reads: every person's."""
RECORDS = ("artifacts", "checkpoints")
"""The buckets whose runs/ tp reads (stacks/naming.py's purposes)."""
ENGINEER_ACTIONS = {"runs": ["states:StartExecution"], "executions": ["states:StopExecution"]}
"""What an ML engineer's tp does besides reading: start runs and stop them."""


class ServedPlatform:
    """The platform's AWS endpoint and decision URL on loopback, its stack's outputs, its people, and env.sh."""

    def __init__(
        self, platform: LocalPlatform, folder: Path, *, stage: str, approver: str, cdk_json: Path | None = None
    ) -> None:
        self.platform = platform
        self.cdk_json = cdk_json
        """The settings the platform was synthesized with, for `tp validate` and `tp check` (TP_CDK_JSON)."""
        self.folder = folder
        self.stage = stage
        self.approver = approver
        self.decision_url = DecisionUrl(platform)
        folder.mkdir(parents=True, exist_ok=True)
        certificate, key = _certificate(folder)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certificate, key)
        self.ca_bundle = certificate
        self._server = make_server(
            HOST,
            0,
            DomainDispatcherApplication(create_backend_app),
            threaded=True,
            request_handler=MotoRequestHandler,
            ssl_context=context,
        )
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"https://{HOST}:{self._server.server_address[1]}"

    @property
    def env_file(self) -> Path:
        return self.folder / "env.sh"

    def __enter__(self) -> ServedPlatform:
        self._thread.start()
        self.decision_url.__enter__()
        people = {ENGINEER: self._person(REQUESTER, "engineer", engineer=True)}
        people[APPROVER] = self._person(self.approver, "approver", engineer=False)
        self._write_files(people)
        return self

    def __exit__(self, *exc: object) -> None:
        self.env_file.unlink(missing_ok=True)  # a shell that sources it later must not find a gone endpoint
        self.decision_url.__exit__(*exc)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def environment(self, profile: str = ENGINEER) -> dict[str, str]:
        """What env.sh exports, with `profile` as AWS_PROFILE: the variables a tp process needs to reach this."""
        outputs = self._outputs()
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_CA_BUNDLE": str(self.ca_bundle),
            "AWS_REGION": REGION,
            "AWS_SHARED_CREDENTIALS_FILE": str(self.folder / "credentials"),
            "AWS_CONFIG_FILE": str(self.folder / "config"),
            "AWS_PROFILE": profile,
            "TP_STAGE": self.stage,
            **{variable: outputs[key] for variable, key in OUTPUT_VARIABLES.items()},
            "TP_DATASETS_BUCKET": outputs[stack_outputs.DATASETS_BUCKET],
            **({"TP_CDK_JSON": str(self.cdk_json)} if self.cdk_json else {}),
        }

    # -- what it sets up ------------------------------------------------------------------------------
    def _outputs(self) -> dict[str, str]:
        """The pipeline stack's outputs, resolved from its template as deployed (the decision URL the local one).

        tp reads them from the TP_* variables: moto's CloudFormation needs the whole of moto's server extras.
        """
        stack = self.platform.pipeline_stack
        template = self.platform.assembly.templates[stack]
        resolve = self.platform.resolver.resolve
        values = {key: str(resolve(stack, output["Value"])) for key, output in template["Outputs"].items()}
        return {**values, stack_outputs.DECISION_URL: self.decision_url.url}

    def _person(self, role_arn: str, session_name: str, *, engineer: bool) -> dict[str, str]:
        """A session of the person's role, which may read the stage (and, as an engineer, start and stop runs)."""
        statements = person_statements(self.platform, engineer=engineer, stage=self.stage)
        session = self.platform.person(role_arn, session_name)
        boto3.client("iam", region_name=REGION).put_role_policy(
            RoleName=role_arn.rsplit("/", 1)[-1],
            PolicyName="UseTp",
            PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": statements}),
        )
        keys = session.get_credentials().get_frozen_credentials()
        return {
            "aws_access_key_id": keys.access_key,
            "aws_secret_access_key": keys.secret_key,
            "aws_session_token": keys.token,
        }

    def _write_files(self, people: dict[str, dict[str, str]]) -> None:
        credentials = "".join(
            f"[{profile}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()) + "\n"
            for profile, keys in people.items()
        )
        (self.folder / "credentials").write_text(credentials)
        os.chmod(self.folder / "credentials", 0o600)
        (self.folder / "config").write_text("".join(f"[profile {p}]\nregion = {REGION}\n\n" for p in people))
        exports = "".join(f"export {name}={value}\n" for name, value in self.environment().items())
        self.env_file.write_text(
            "# The local platform served by `make demo ARGS=--serve` (while it runs): tp and any AWS SDK in a shell\n"
            "# that sources this file talk to it, as the ML engineer; AWS_PROFILE=local-approver for the approver.\n"
            "unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN AWS_DEFAULT_REGION\n" + exports
        )


def person_statements(platform: LocalPlatform, *, engineer: bool, stage: str) -> list[dict[str, Any]]:
    """A person's policy statements for tp: what every person reads, and what an engineer does besides."""
    statements = _statements(platform, READER_ACTIONS, stage)
    return statements + (_statements(platform, ENGINEER_ACTIONS, stage) if engineer else [])


def _statements(platform: LocalPlatform, actions: dict[str, list[str]], stage: str) -> list[dict[str, Any]]:
    """The actions on the stage's resources they act on, resolved from the deployed platform."""
    machine = platform.state_machine_arn
    # The runs' records: lineage and cost in the artifacts bucket, progress records in the checkpoints bucket.
    buckets = [
        name
        for stack, logical, _ in platform.assembly.resources("AWS::S3::Bucket")
        if any(f"-{purpose}-" in (name := str(platform.resolver.ref(stack, logical))) for purpose in RECORDS)
    ]
    resources = {
        "stage": [f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/training-platform-{stage}-*/*"],
        "runs": [machine],
        "executions": [f"{machine.replace(':stateMachine:', ':execution:')}:*"],
        "jobs": ["*"],
        "logs": [
            f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}:*"
            for group in (stack_outputs.SAGEMAKER_TRAINING_LOG_GROUP, stack_outputs.BATCH_JOB_LOG_GROUP)
        ]
        + [
            f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}:log-stream:*"
            for group in (stack_outputs.SAGEMAKER_TRAINING_LOG_GROUP, stack_outputs.BATCH_JOB_LOG_GROUP)
        ],
        "records": [f"arn:aws:s3:::{b}" for b in buckets]
        + [f"arn:aws:s3:::{b}/runs/*" for b in buckets]
        + [platform.training_key_arn()],
        "self": [f"arn:aws:iam::{ACCOUNT}:role/*"],
    }
    return [{"Effect": "Allow", "Action": list(acts), "Resource": resources[what]} for what, acts in actions.items()]


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA: AWS_CA_BUNDLE names it), and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "training platform, local")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    certificate_path, key_path = folder / "ca.pem", folder / "key.pem"
    certificate_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    os.chmod(key_path, 0o600)
    return certificate_path, key_path
