"""The key of a state machine's definition, inputs, outputs and history: decrypted by its roles and named people.

An execution's history holds what its states pass around, the approval gates' task tokens
included. The key policy lets the account's IAM administer the key but not use it; only the
roles named here (the state machine's own, the approval decision function's) and the named
administrators may decrypt, and anyone the account's IAM allows may encrypt a new execution's
input for this state machine (StartExecution needs that), without being able to read one back.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Aws, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from stacks.constructs.keys import ADMINISTRATION, grants_for_aws_services_only
from stacks.constructs.nag import acknowledge_inline_policy, acknowledge_wildcard

USE = ["kms:Decrypt", "kms:GenerateDataKey"]


class ExecutionDataKey(Construct):
    """A retained, rotating key for a state machine's data; the roles `allow()` names and `readers` may decrypt."""

    def __init__(self, scope: Construct, id_: str, *, readers: list[str]) -> None:
        super().__init__(scope, id_)
        self._machines = f"arn:{Aws.PARTITION}:states:{Aws.REGION}:{Aws.ACCOUNT_ID}:stateMachine:*"
        self._users = iam.PolicyStatement(
            sid="PlatformRoles",
            actions=USE,
            resources=["*"],
            conditions={"ArnLike": {"kms:EncryptionContext:aws:states:stateMachineArn": self._machines}},
        )
        statements = [
            iam.PolicyStatement(
                sid="AdministerWithoutUse",
                principals=[iam.AccountRootPrincipal()],
                actions=ADMINISTRATION,
                resources=["*"],
            ),
            iam.PolicyStatement(
                sid="StartExecutions",
                principals=[iam.AccountRootPrincipal()],
                actions=["kms:GenerateDataKey"],
                resources=["*"],
                conditions={
                    "ArnLike": {"kms:EncryptionContext:aws:states:stateMachineArn": self._machines},
                    "StringEquals": {"kms:ViaService": f"states.{Aws.REGION}.amazonaws.com"},
                },
            ),
            self._users,
            grants_for_aws_services_only(),
        ]
        if readers:
            statements.append(
                iam.PolicyStatement(
                    sid="NamedReaders",
                    principals=[iam.ArnPrincipal(arn) for arn in sorted(readers)],
                    # Decrypt only: no describe action supports the encryption context the condition names.
                    actions=["kms:Decrypt"],
                    resources=["*"],
                    conditions={"ArnLike": {"kms:EncryptionContext:aws:states:stateMachineArn": self._machines}},
                )
            )
        self.key = kms.Key(
            self,
            "Key",
            description="Encrypts the training pipeline's definition, execution inputs, outputs and history",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.RETAIN,
            policy=iam.PolicyDocument(statements=statements),
        )

    def bind_log_delivery(self) -> None:
        """Bind the statement CDK adds for CloudWatch Logs delivery of an encrypted state machine to this account.

        Call after the state machine exists. Delivery decrypts data encrypted under a state machine's
        encryption context, so the condition on that context admits this account's state machines only.
        """
        key = self.key.node.default_child
        assert isinstance(key, kms.CfnKey)
        statements = Stack.of(self).resolve(key.key_policy)["Statement"]
        (index,) = [
            i
            for i, s in enumerate(statements)
            if s.get("Principal", {}).get("Service") == "delivery.logs.amazonaws.com"
        ]
        key.add_property_override(
            f"KeyPolicy.Statement.{index}.Condition",
            {"ArnLike": {"kms:EncryptionContext:aws:states:stateMachineArn": self._machines}},
        )

    def allow_reading(self, role: iam.IRole) -> None:
        """Let a role decrypt the state machine's data (an execution's history), never encrypt it."""
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ArnPrincipal(role.role_arn)],
                actions=["kms:Decrypt"],
                resources=["*"],
                conditions={"ArnLike": {"kms:EncryptionContext:aws:states:stateMachineArn": self._machines}},
            )
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["kms:Decrypt"],
                resources=[self.key.key_arn],
                conditions={"ArnLike": {"kms:EncryptionContext:aws:states:stateMachineArn": self._machines}},
            )
        )

    def allow(self, *roles: iam.IRole) -> None:
        """Let these roles decrypt and encrypt the state machine's data (key policy and their own policies)."""
        for role in roles:
            self._users.add_arn_principal(role.role_arn)
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=USE,
                    resources=[self.key.key_arn],
                    conditions={"ArnLike": {"kms:EncryptionContext:aws:states:stateMachineArn": self._machines}},
                )
            )

    def allow_reading_executions(
        self, scope: Construct, id_: str, role: iam.IRole, state_machine: sfn.StateMachine, *, why: str
    ) -> None:
        """Let a role read the executions of `state_machine` (status and history, and the data key they are
        encrypted with), by a policy `id_` of its own in `scope`: not the role's default one, so that a function
        the state machine invokes need not wait for it. `why`: the acknowledgement of the executions' wildcard."""
        executions = Stack.of(scope).format_arn(
            service="states",
            resource="execution",
            resource_name=f"{state_machine.state_machine_name}:*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        policy = iam.Policy(
            scope,
            id_,
            roles=[role],
            statements=[
                iam.PolicyStatement(
                    actions=["states:DescribeExecution", "states:GetExecutionHistory"], resources=[executions]
                )
            ],
        )
        acknowledge_inline_policy(policy)
        self.allow_reading(role)
        acknowledge_wildcard(scope, executions, why)
