"""The harness's shortcuts through moto change what it costs, never what it accepts."""

from __future__ import annotations

import json
from unittest import mock

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from localrun.aws import moto_fixes

ROLE = "arn:aws:iam::123456789012:role/StateMachineRole"
VALID = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}})
INVALID = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Succeed", "Next": "Nowhere"}}})


def test_an_invalid_definition_is_refused_every_time_a_valid_one_is_accepted_every_time() -> None:
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}), moto_fixes.definitions_validated_once():
        sfn = boto3.client("stepfunctions", region_name="us-east-1")
        for attempt in range(2):
            sfn.create_state_machine(name=f"valid-{attempt}", definition=VALID, roleArn=ROLE)
            with pytest.raises(ClientError, match="Succeed states are terminal states"):
                sfn.create_state_machine(name=f"invalid-{attempt}", definition=INVALID, roleArn=ROLE)


def test_only_the_named_aws_managed_policies_exist_and_unknown_names_are_refused() -> None:
    with mock_aws(), moto_fixes.aws_managed_policies_only(["AWSLambdaBasicExecutionRole"]):
        iam = boto3.client("iam", region_name="us-east-1")
        iam.create_role(RoleName="fn", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}))
        basic = "arn:aws:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"
        iam.attach_role_policy(RoleName="fn", PolicyArn=basic)
        with pytest.raises(ClientError, match="NoSuchEntity"):
            iam.attach_role_policy(RoleName="fn", PolicyArn="arn:aws:iam::aws:policy/AdministratorAccess")
    with pytest.raises(ValueError, match="not an AWS managed policy moto knows: AWSLambdaBasicExecutionRoel"):
        moto_fixes.aws_managed_policies_only(["AWSLambdaBasicExecutionRoel"])


def test_a_role_created_while_a_lookup_iterates_the_roles_does_not_fail_the_lookup() -> None:
    """As when the harness creates a person's role on its thread while a handler's call is judged on another."""
    from moto.iam.models import iam_backends

    trust = json.dumps({"Version": "2012-10-17", "Statement": []})
    with mock_aws(), moto_fixes.roles_read_from_a_copy():
        iam = boto3.client("iam", region_name="us-east-1")
        iam.create_role(RoleName="fn", AssumeRolePolicyDocument=trust)
        backend = iam_backends["123456789012"]["aws"]

        class CreatesARoleWhenRead:
            """A role whose name, once read, has another role created: the other thread's step, taken mid-lookup."""

            created = False

            @property
            def name(self) -> str:
                if not self.created:
                    self.created = True
                    backend.create_role("person", trust, "/", None, "", [], None)
                return "interleaved"

            arn = name

        backend.roles = {"interleaved": CreatesARoleWhenRead(), **backend.roles}
        assert backend.get_role("fn").name == "fn"
        assert backend.get_role_by_arn("arn:aws:iam::123456789012:role/fn").name == "fn"
        assert backend.get_role("person").name == "person"


def test_a_keys_asymmetric_material_is_made_on_first_use_and_serves_as_mocked_kms_always_did() -> None:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

    made: list[int] = []
    generate = rsa.generate_private_key

    def counted(*args: object, **kwargs: object) -> rsa.RSAPrivateKey:
        made.append(1)
        return generate(*args, **kwargs)  # type: ignore[arg-type]

    with mock_aws(), moto_fixes.key_material_on_first_use(), mock.patch.object(rsa, "generate_private_key", counted):
        kms = boto3.client("kms", region_name="us-east-1")
        symmetric = kms.create_key()["KeyMetadata"]["KeyId"]
        blob = kms.encrypt(KeyId=symmetric, Plaintext=b"secret", EncryptionContext={"run": "a"})["CiphertextBlob"]
        assert kms.decrypt(CiphertextBlob=blob, EncryptionContext={"run": "a"})["Plaintext"] == b"secret"
        assert made == []  # a symmetric key's life: no RSA key made
        for spec, algorithm in (("RSA_2048", "RSASSA_PSS_SHA_256"), ("ECC_NIST_P256", "ECDSA_SHA_256")):
            key = kms.create_key(KeyUsage="SIGN_VERIFY", KeySpec=spec)["KeyMetadata"]["KeyId"]
            signature = kms.sign(KeyId=key, Message=b"m", SigningAlgorithm=algorithm)["Signature"]
            verified = kms.verify(KeyId=key, Message=b"m", Signature=signature, SigningAlgorithm=algorithm)
            assert verified["SignatureValid"]
            public = serialization.load_der_public_key(kms.get_public_key(KeyId=key)["PublicKey"])
            if isinstance(public, rsa.RSAPublicKey):
                pss = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)
                public.verify(signature, b"m", pss, hashes.SHA256())  # the public key answered is the signer's
            else:
                assert isinstance(public, ec.EllipticCurvePublicKey)
                public.verify(signature, b"m", ec.ECDSA(hashes.SHA256()))
        assert made == [1]  # the RSA key, once, when it first signed
