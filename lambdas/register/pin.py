"""What a registered model version's artifacts were: each one's S3 object version and the SHA-256 of its bytes.

SageMaker's `ModelDataUrl` names a key, not a version, and a deployment loads whatever the key holds then; the
lineage record is a key too. So Register reads the version each key holds and hashes its bytes, and the model
package carries both beside the key (`CustomerMetadataProperties`, `<artifact>_version_id` and `<artifact>_sha256`);
promotion (lambdas/register/verify.py) refuses a version whose keys now hold other bytes. The buckets are
versioned: a version's bytes never change, so a key that still holds its pinned version holds the pinned bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from contract.layout import split_s3_uri

_CHUNK = 8 * 1024 * 1024
MODEL, LINEAGE = "model", "lineage"
"""The pinned artifacts, by the name their metadata keys start with: the model archive (`ModelDataUrl`) and the
lineage record (the `lineage` metadata property)."""


@dataclass(frozen=True)
class Pinned:
    """One artifact as Register read it: its key's URI, the version that key held, the SHA-256 of its bytes."""

    uri: str
    version_id: str
    sha256: str

    def metadata(self, name: str) -> dict[str, str]:
        """The model package's metadata properties that hold this pin of artifact `name`."""
        return {f"{name}_version_id": self.version_id, f"{name}_sha256": self.sha256}

    @classmethod
    def from_metadata(cls, uri: str, name: str, metadata: dict[str, str]) -> Pinned:
        """Artifact `name`'s pin as a package's metadata holds it (empty strings where it holds none)."""
        return cls(uri, metadata.get(f"{name}_version_id", ""), metadata.get(f"{name}_sha256", ""))


def sha256_of(s3: Any, uri: str, version_id: str) -> str:
    """The SHA-256 of one version's bytes, read in chunks (a model archive may not fit in memory)."""
    bucket, key = split_s3_uri(uri)
    body = s3.get_object(Bucket=bucket, Key=key, VersionId=version_id)["Body"]
    digest = hashlib.sha256()
    for chunk in iter(lambda: body.read(_CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def current_version(s3: Any, uri: str) -> str:
    """The version the key of `uri` holds now; S3 answers "null" for an object written while versioning was off."""
    bucket, key = split_s3_uri(uri)
    return str(s3.head_object(Bucket=bucket, Key=key).get("VersionId") or "null")


def pin(s3: Any, uri: str) -> Pinned:
    """The version `uri`'s key holds now and the digest of that version's bytes."""
    version = current_version(s3, uri)
    return Pinned(uri, version, sha256_of(s3, uri, version))
