"""Operator configuration from the environment (``BUCKETQ_OPERATOR_*``).

The S3 connection is the engine's own :class:`~bucketq.config.Settings` (``BUCKETQ_*``, credentials
typically from a Secret mounted as environment variables); it is never read from a custom resource.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bucketq.core.fences import DELTA_GRACE_S, DELTA_TRUST_S, SEGMENT_GRACE_S, SEGMENT_TRUST_S

DEFAULT_SIDECAR_IMAGE = "ghcr.io/bucketq/bucketq:0.1.0"


class OperatorSettings(BaseSettings):
    """What the operator watches, how often it works, and how it injects sidecars."""

    model_config = SettingsConfigDict(env_prefix="BUCKETQ_OPERATOR_", extra="forbid", validate_default=True)

    # scope: empty = every namespace
    namespaces: Annotated[list[str], NoDecode] = Field(default_factory=list)

    namespace_resync_s: float = Field(
        60.0,
        gt=0,
        description="How often a namespace-scoped operator lists the namespaces and serves a matching one "
        "its namespace watch missed (one created while the operator starts, or while the watch restarts).",
    )

    # periodic work
    status_interval_s: float = Field(30.0, gt=0, description="Refresh of status figures and metrics.")
    gc_interval_s: float = Field(300.0, gt=0, description="Retention and garbage collection per topic.")
    member_ttl_s: float = Field(300.0, gt=0, description="Member heartbeats older than this are deleted.")
    dedup_window_s: float = Field(3600.0, gt=0, description="Dedup markers older than this are deleted.")
    gc_segment_grace_s: float = Field(
        SEGMENT_GRACE_S,
        ge=0,
        description="GC frees segments this long after raising a partition's floor fence. Keep it above the "
        f"writers' fence trust ({SEGMENT_TRUST_S:.0f} s) plus clock skew: lower values break the "
        "never-reuse-a-number invariant (tests only).",
    )
    gc_delta_grace_s: float = Field(
        DELTA_GRACE_S,
        ge=0,
        description=f"The same for cursor deltas (writers trust a fence copy {DELTA_TRUST_S:.0f} s).",
    )
    store_checks: bool = Field(
        True,
        description="Run the store checks (bucketq doctor) at start and report them as the StoreChecked "
        "condition of every Topic and in bucketq_store_check_passed.",
    )
    retry_min_s: float = Field(2.0, gt=0, description="First retry delay after a failed reconcile.")
    retry_max_s: float = Field(300.0, gt=0, description="Longest retry delay (exponential backoff).")

    # kopf
    peering: str | None = Field(None, description="kopf peering name; None runs standalone (one replica).")

    # high availability: replicas elect one active operator over a coordination.k8s.io Lease
    leader_election: bool = Field(
        False,
        description="Run as one of several replicas: the one holding the Lease reconciles and collects "
        "garbage, the others stand by (watching Consumers for the scaling endpoint) and take over within "
        "about a lease duration when it stops renewing (docs/operator.md, 'High availability').",
    )
    leader_lease_name: str = "bucketq-operator"
    leader_lease_namespace: str | None = Field(
        None, description="Namespace of the Lease (default: the pod's own, POD_NAMESPACE)."
    )
    leader_identity: str | None = Field(None, description="This replica's name (default: POD_NAME).")
    leader_lease_duration_s: float = Field(15.0, gt=0, description="A standby takes over after this long.")
    leader_renew_deadline_s: float = Field(
        10.0, gt=0, description="A leader that could not renew for this long stops working and exits."
    )
    leader_retry_period_s: float = Field(2.0, gt=0, description="How often the Lease is renewed or tried.")
    liveness_port: int = Field(8080, ge=0, le=65535, description="kopf's /healthz port; 0 disables it.")
    metrics_host: str = "0.0.0.0"
    metrics_port: int = Field(9090, ge=0, le=65535, description="/metrics port; 0 disables it.")

    # admission webhook
    webhook: bool = True
    webhook_only: bool = Field(
        False,
        description="Serve only the admission webhook (no reconcilers, timers, metrics or bucket access): "
        "the mode of the webhook Deployment, whose replicas all serve at once.",
    )
    webhook_addr: str = "0.0.0.0"
    webhook_port: int = Field(9443, ge=1, le=65535)
    webhook_host: str | None = Field(
        None, description="Host name the apiserver uses (the Service's DNS name)."
    )
    webhook_cert_file: str | None = Field(
        None, description="TLS certificate (else a self-signed one is made)."
    )
    webhook_key_file: str | None = None
    webhook_ca_file: str | None = Field(None, description="CA bundle for the webhook configuration.")
    webhook_insecure: bool = Field(False, description="Plain HTTP (tests and local runs only).")
    webhook_managed: bool = Field(
        True, description="Let the operator maintain its MutatingWebhookConfiguration."
    )
    webhook_failure_policy: Literal["Fail", "Ignore"] = Field(
        "Fail",
        description="The webhook's failurePolicy (in the managed configuration; the Helm chart renders the "
        "same value). Fail: a pod asking for a sidecar is refused while no webhook answers.",
    )
    webhook_consumer_wait_s: float = Field(
        3.0,
        ge=0,
        le=20,
        description="How long a pod naming a Consumer the webhook has not seen yet waits for it to arrive "
        "through the watch (a Consumer applied together with its Deployment, a webhook just started).",
    )
    missing_consumer: Literal["reject", "warn"] = "reject"

    # the injected sidecar
    sidecar_image: str = DEFAULT_SIDECAR_IMAGE
    sidecar_image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    sidecar_native: bool = Field(
        True, description="Init container with restartPolicy Always (Kubernetes 1.29+)."
    )
    # Ports of the sidecar in each pod (per pod: bucketq.io/api-port, bucketq.io/metrics-port). Away from
    # the ports of other meshes' sidecars (Dapr 3500/9090/50001, Istio 15000-15090).
    sidecar_api_port: int = Field(3580, ge=1, le=65535)
    sidecar_metrics_port: int = Field(9580, ge=1, le=65535)
    # UDP, on the pod IP: producers ping idle members here (wake pings, docs/protocol.md I14); a
    # fixed port so that a NetworkPolicy can allow it. 0: pings off (pickup by the wake poll)
    sidecar_wake_port: int = Field(7470, ge=0, le=65535)
    sidecar_secret: str = Field(
        "bucketq-sidecar-s3",
        description="Default Secret with the pods' S3 credentials, in each pod's namespace: a key limited "
        "to that namespace's prefix (docs/security.md), never a copy of the operator's (whence its own name).",
    )
    sidecar_secret_access_key_id_key: str = "accessKeyId"
    sidecar_secret_secret_access_key_key: str = "secretAccessKey"
    sidecar_s3_endpoint_url: str | None = Field(
        None, description="S3 endpoint as seen from pods (default: ours)."
    )
    sidecar_cpu_request: str = "50m"
    sidecar_memory_request: str = "64Mi"
    sidecar_cpu_limit: str | None = None
    sidecar_memory_limit: str | None = "256Mi"
    sidecar_run_as_user: int = Field(65532, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> OperatorSettings:
        if self.sidecar_wake_port in (self.sidecar_api_port, self.sidecar_metrics_port):
            raise ValueError(
                f"sidecar_wake_port {self.sidecar_wake_port} is also the sidecar's API or metrics port"
            )
        if self.sidecar_api_port == self.sidecar_metrics_port:
            raise ValueError(
                f"sidecar_api_port and sidecar_metrics_port are both {self.sidecar_api_port}: the sidecar "
                "needs two ports"
            )
        if self.webhook_only:
            self._check_webhook_only()
        if self.leader_election:
            self._check_leader_election()
        return self

    def _check_leader_election(self) -> None:
        if self.webhook or self.webhook_only:
            raise ValueError(
                "leader_election needs webhook=false: a standby replica serves no webhook (run the "
                "injector as its own Deployment, --webhook-only, as the Helm chart does)"
            )
        if self.peering is not None:
            raise ValueError("leader_election replaces kopf peering: leave peering unset")
        if not 0 < self.leader_retry_period_s < self.leader_renew_deadline_s < self.leader_lease_duration_s:
            raise ValueError(
                "leader election needs leader_retry_period_s < leader_renew_deadline_s < "
                "leader_lease_duration_s"
            )

    def _check_webhook_only(self) -> None:
        """Webhook replicas run side by side: no leader, no configuration of their own, one certificate."""
        if not self.webhook:
            raise ValueError("webhook_only needs webhook=true")
        if self.peering is not None:
            raise ValueError(
                "webhook_only runs without peering: every replica serves, and a paused peer would stop "
                "watching the Consumers the webhook reads"
            )
        if self.webhook_managed:
            raise ValueError(
                "webhook_only needs webhook_managed=false: replicas would each rewrite the "
                "MutatingWebhookConfiguration (ship it, as the Helm chart does)"
            )
        if not self.webhook_insecure and (self.webhook_cert_file is None or self.webhook_key_file is None):
            raise ValueError(
                "webhook_only needs webhook_cert_file and webhook_key_file: every replica must serve the "
                "same certificate (a self-signed one would differ per replica and match no caBundle)"
            )

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [n.strip() for n in value.split(",") if n.strip()]
        return value
