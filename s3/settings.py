"""What the artifact store needs to reach S3: the endpoints, the bucket, the farm's keys and
each worker role's own keys. The [s3] section of the farm's config is this model (gearfarm.config
reads it), so s3/ takes plain values and imports nothing of the farm's."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _S3Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class S3Keys(_S3Section):
    access_key: str
    secret_key: str


class S3Config(_S3Section):
    endpoint: str = "http://127.0.0.1:9000"
    # Further endpoints of the same storage (the other nodes of a distributed MinIO), tried in
    # order when the one in use does not answer: one node down then costs no outage wait.
    endpoints: list[str] = Field(default_factory=list)
    bucket: str = "gearfarm"
    # The farm's own keys: the nightly and the dashboard.
    access_key: str = "gearfarm"
    secret_key: str = ""
    region: str = "us-east-1"
    ca_bundle: str | None = None
    presign_expiry: int = 7 * 24 * 3600
    # Each worker role's own MinIO user ([s3.roles.build] access_key/secret_key), whose
    # policy allows only what the role does (gearfarm.s3.keys.role_policy). A lab host lists
    # only the roles it runs.
    roles: dict[str, S3Keys] = Field(default_factory=dict)

    @field_validator("endpoint")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"S3 endpoint {v!r} must start with http:// or https://")
        return v

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, v: list[str], info: Any) -> list[str]:
        seen = [info.data.get("endpoint")]
        for e in v:
            cls._url(e)
            if e in seen:
                raise ValueError(f"S3 endpoint {e!r} is listed twice (endpoint and endpoints are one list)")
            seen.append(e)
        return v

    def endpoint_list(self) -> list[str]:
        """Every endpoint of the storage, the one to use first first."""
        return [self.endpoint, *self.endpoints]

    @field_validator("roles")
    @classmethod
    def _known_roles(cls, v: dict[str, S3Keys]) -> dict[str, S3Keys]:
        for role in v:
            if role not in ("build", "test", "perf", "collector"):
                raise ValueError(f"[s3.roles.{role}]: not a worker role (build, test, perf, collector)")
        return v

    def for_role(self, role: str) -> S3Config:
        """This config with ``role``'s keys (the farm's own when the role has none, with a
        warning from the worker: it then can do more than its role needs)."""
        keys = self.roles.get(role)
        if keys is None:
            return self
        return self.model_copy(update={"access_key": keys.access_key, "secret_key": keys.secret_key, "roles": {}})
