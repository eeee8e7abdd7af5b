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
