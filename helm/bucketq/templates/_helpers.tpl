{{/* Names and labels. */}}
{{- define "bucketq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bucketq.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "bucketq.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bucketq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "bucketq.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "bucketq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: bucketq
{{- end -}}

{{- define "bucketq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "bucketq.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image reference: repository plus digest, else tag (default: appVersion). */}}
{{- define "bucketq.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "bucketq.webhookServiceName" -}}
{{- printf "%s-webhook" (include "bucketq.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bucketq.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "bucketq.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bucketq.webhookCertName" -}}
{{- printf "%s-webhook" (include "bucketq.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The DNS names the apiserver may use for the webhook Service. */}}
{{- define "bucketq.webhookDnsNames" -}}
{{- $svc := include "bucketq.webhookServiceName" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson -}}
{{- end -}}

{{/* cert-manager is asked for, and must be there. */}}
{{- define "bucketq.certManager" -}}
{{- if and .Values.webhook.enabled .Values.certManager.enabled -}}
{{- if not (.Capabilities.APIVersions.Has "cert-manager.io/v1") -}}
{{- fail "certManager.enabled: the cluster does not serve cert-manager.io/v1 (install cert-manager, or set certManager.enabled=false for a chart-generated certificate)" -}}
{{- end -}}
true
{{- end -}}
{{- end -}}

{{/*
The chart-generated webhook TLS material, as a dict of base64 strings (ca.crt, tls.crt, tls.key).
Made once per render (memoized, so that the Secret, the caBundle and the Deployment's checksum
agree) and kept across upgrades: an existing Secret in the cluster is reused as it is.
*/}}
{{- define "bucketq.webhookTls" -}}
{{- if not (hasKey .Values.webhook "__tls") -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "bucketq.webhookSecretName" .) -}}
{{- $data := dict -}}
{{- if and $secret $secret.data -}}
{{- $data = $secret.data -}}
{{- end -}}
{{- if and (index $data "ca.crt") (index $data "tls.crt") (index $data "tls.key") -}}
{{- $_ := set .Values.webhook "__tls" (dict "ca.crt" (index $data "ca.crt") "tls.crt" (index $data "tls.crt") "tls.key" (index $data "tls.key")) -}}
{{- else -}}
{{- $dns := include "bucketq.webhookDnsNames" . | fromJsonArray -}}
{{- $days := int .Values.webhook.certValidityDays -}}
{{- $ca := genCA (printf "%s-webhook-ca" (include "bucketq.fullname" .)) $days -}}
{{- $cert := genSignedCert (index $dns 2) nil $dns $days $ca -}}
{{- $_ := set .Values.webhook "__tls" (dict "ca.crt" ($ca.Cert | b64enc) "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc)) -}}
{{- end -}}
{{- end -}}
{{- toJson (get .Values.webhook "__tls") -}}
{{- end -}}

{{- define "bucketq.webhookTlsChecksum" -}}
{{- if include "bucketq.certManager" . -}}
cert-manager
{{- else -}}
{{- include "bucketq.webhookTls" . | sha256sum -}}
{{- end -}}
{{- end -}}

{{/* The webhook Deployment's pods (their own component: the operator's selector stays as it was). */}}
{{- define "bucketq.webhookSelectorLabels" -}}
app.kubernetes.io/name: {{ include "bucketq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "bucketq.webhookDeploymentName" -}}
{{- printf "%s-webhook" (include "bucketq.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The webhook's own ServiceAccount: it reads Consumers and nothing else (no S3 identity either). */}}
{{- define "bucketq.webhookServiceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- printf "%s-webhook" (include "bucketq.serviceAccountName" .) | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- include "bucketq.serviceAccountName" . -}}
{{- end -}}
{{- end -}}

{{/* The engine settings every bucketq process gets (no credentials: each adds its own). */}}
{{- define "bucketq.engineEnv" -}}
{{- $s3 := .Values.s3 -}}
- name: BUCKETQ_BACKEND
  value: s3
- name: BUCKETQ_S3_BUCKET
  value: {{ $s3.bucket | quote }}
{{- with $s3.endpointUrl }}
- name: BUCKETQ_S3_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
- name: BUCKETQ_S3_REGION
  value: {{ $s3.region | quote }}
- name: BUCKETQ_S3_PATH_STYLE
  value: {{ $s3.pathStyle | quote }}
- name: BUCKETQ_ROOT
  value: {{ $s3.root | quote }}
- name: BUCKETQ_STRATEGY
  value: {{ $s3.strategy | quote }}
{{- end -}}

{{/* What the webhook injects: the sidecar's image, ports, resources and credentials Secret. */}}
{{- define "bucketq.sidecarEnv" -}}
{{- $s3 := .Values.s3 -}}
{{- $sc := .Values.sidecar -}}
- name: BUCKETQ_OPERATOR_SIDECAR_IMAGE
  value: {{ default (include "bucketq.image" .) $sc.image | quote }}
- name: BUCKETQ_OPERATOR_SIDECAR_IMAGE_PULL_POLICY
  value: {{ $sc.pullPolicy | quote }}
- name: BUCKETQ_OPERATOR_SIDECAR_NATIVE
  value: {{ $sc.native | quote }}
- name: BUCKETQ_OPERATOR_SIDECAR_API_PORT
  value: {{ $sc.apiPort | quote }}
- name: BUCKETQ_OPERATOR_SIDECAR_METRICS_PORT
  value: {{ $sc.metricsPort | quote }}
- name: BUCKETQ_OPERATOR_SIDECAR_WAKE_PORT
  value: {{ $sc.wakePort | quote }}
- name: BUCKETQ_OPERATOR_SIDECAR_SECRET
  value: {{ default (default "none" $s3.existingSecret) $sc.s3Secret | quote }}
- name: BUCKETQ_OPERATOR_SIDECAR_SECRET_ACCESS_KEY_ID_KEY
  value: {{ $s3.accessKeyIdKey | quote }}
- name: BUCKETQ_OPERATOR_SIDECAR_SECRET_SECRET_ACCESS_KEY_KEY
  value: {{ $s3.secretAccessKeyKey | quote }}
{{- with $sc.s3EndpointUrl }}
- name: BUCKETQ_OPERATOR_SIDECAR_S3_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
- name: BUCKETQ_OPERATOR_SIDECAR_CPU_REQUEST
  value: {{ dig "requests" "cpu" "" $sc.resources | quote }}
- name: BUCKETQ_OPERATOR_SIDECAR_MEMORY_REQUEST
  value: {{ dig "requests" "memory" "" $sc.resources | quote }}
- name: BUCKETQ_OPERATOR_SIDECAR_CPU_LIMIT
  value: {{ dig "limits" "cpu" "" $sc.resources | quote }}
- name: BUCKETQ_OPERATOR_SIDECAR_MEMORY_LIMIT
  value: {{ dig "limits" "memory" "" $sc.resources | quote }}
- name: BUCKETQ_OPERATOR_SIDECAR_RUN_AS_USER
  value: {{ $sc.runAsUser | quote }}
{{- end -}}
