{{- define "backfill.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "backfill.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "backfill.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "backfill.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "backfill.selectorLabels" -}}
app.kubernetes.io/name: {{ include "backfill.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "backfill.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "backfill.configMapName" -}}
{{- .Values.config.existingConfigMap | default (printf "%s-config" (include "backfill.fullname" .)) }}
{{- end }}

{{- define "backfill.claimName" -}}
{{- .Values.fileStore.pvc.existingClaim | default (printf "%s-files" (include "backfill.fullname" .)) }}
{{- end }}

{{/* Environment shared by the api and the workers. */}}
{{- define "backfill.env" -}}
- name: TEMPORAL_ADDRESS
  value: {{ .Values.temporal.address | quote }}
- name: TEMPORAL_NAMESPACE
  value: {{ .Values.temporal.namespace | quote }}
- name: BACKFILL_TASK_QUEUE
  value: {{ .Values.temporal.taskQueue | quote }}
- name: BACKFILL_CONFIG
  value: /etc/backfill/backfill.toml
- name: BACKFILL_DATA_DIR
  value: /data
- name: BACKFILL_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- if .Values.temporal.tls.enabled }}
- name: TEMPORAL_TLS
  value: "true"
{{- end }}
{{- if .Values.temporal.tls.clientCertSecret }}
- name: TEMPORAL_TLS_CERT
  value: /etc/temporal-tls/tls.crt
- name: TEMPORAL_TLS_KEY
  value: /etc/temporal-tls/tls.key
{{- end }}
{{- if or .Values.temporal.apiKey.existingSecret .Values.temporal.apiKey.value }}
- name: TEMPORAL_API_KEY
  valueFrom:
    secretKeyRef:
      {{- if .Values.temporal.apiKey.existingSecret }}
      name: {{ .Values.temporal.apiKey.existingSecret }}
      key: {{ .Values.temporal.apiKey.key }}
      {{- else }}
      name: {{ include "backfill.secretsName" . }}
      key: temporal-api-key
      {{- end }}
{{- end }}
{{- if .Values.preempt.existingSecret }}
- name: BACKFILL_PREEMPT_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .Values.preempt.existingSecret }}
      key: {{ .Values.preempt.key }}
{{- with .Values.preempt.networks }}
- name: BACKFILL_PREEMPT_NETWORKS
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret the chart makes for secrets given as values (`secrets.yaml`). */}}
{{- define "backfill.secretsName" -}}
{{ include "backfill.fullname" . }}-secrets
{{- end }}

{{/* BACKFILL_WEBHOOK_KEY, for the api and the workers that run activities (they sign). */}}
{{- define "backfill.webhookKeyEnv" -}}
{{- $key := .Values.webhooks.key -}}
{{- if and $key.value (lt (len $key.value) 32) }}
{{- fail "webhooks.key.value must have at least 32 characters (openssl rand -hex 32)" }}
{{- end }}
{{- if or $key.existingSecret $key.value }}
- name: BACKFILL_WEBHOOK_KEY
  valueFrom:
    secretKeyRef:
      {{- if $key.existingSecret }}
      name: {{ $key.existingSecret }}
      key: {{ $key.key }}
      {{- else }}
      name: {{ include "backfill.secretsName" . }}
      key: webhook-key
      {{- end }}
{{- end }}
{{- end }}

{{/* Called with (dict "root" $ "signs" bool): the upstream keys, and for the processes that
sign webhook deliveries (`signs`), the configured endpoints' secrets. */}}
{{- define "backfill.envFrom" -}}
{{- $values := .root.Values -}}
{{- $endpoints := and .signs $values.webhooks.endpointSecrets.existingSecret -}}
{{- if or $values.upstreamKeys.existingSecret $endpoints }}
envFrom:
  {{- with $values.upstreamKeys.existingSecret }}
  - secretRef:
      name: {{ . }}
  {{- end }}
  {{- if $endpoints }}
  - secretRef:
      name: {{ $values.webhooks.endpointSecrets.existingSecret }}
  {{- end }}
{{- end }}
{{- end }}

{{/* Environment of the processes that open the file store (the api, workers running
activities): the S3 store's settings and credentials. Nothing in pvc mode. */}}
{{- define "backfill.storeEnv" -}}
{{- if eq .Values.fileStore.type "s3" -}}
- name: BACKFILL_STORE
  value: "s3"
- name: BACKFILL_S3_BUCKET
  value: {{ .Values.fileStore.s3.bucket | quote }}
{{- with .Values.fileStore.s3.prefix }}
- name: BACKFILL_S3_PREFIX
  value: {{ . | quote }}
{{- end }}
{{- with .Values.fileStore.s3.endpoint }}
- name: BACKFILL_S3_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.fileStore.s3.region }}
- name: BACKFILL_S3_REGION
  value: {{ . | quote }}
{{- end }}
{{- with .Values.fileStore.s3.partBytes }}
- name: BACKFILL_S3_PART_BYTES
  value: {{ . | int64 | quote }}
{{- end }}
{{- with .Values.fileStore.s3.credentialsSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: AWS_ACCESS_KEY_ID
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: AWS_SECRET_ACCESS_KEY
- name: AWS_SESSION_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: AWS_SESSION_TOKEN
      optional: true
{{- end }}
{{- end }}
{{- end }}

{{/* The volume at /data (BACKFILL_DATA_DIR): with pvc, the shared file store; with s3, only the
usage journal (usage/), on fileStore.s3.usageJournalClaim or an emptyDir. */}}
{{- define "backfill.dataVolumeName" -}}
{{- if eq .Values.fileStore.type "s3" }}usage{{ else }}files{{ end }}
{{- end }}

{{/* Called with (dict "root" $ "data" bool): "data" false leaves /data out (a workflows-only
worker opens neither the store nor the usage journal). */}}
{{- define "backfill.volumeMounts" -}}
- name: config
  mountPath: /etc/backfill
  readOnly: true
{{- if .data }}
- name: {{ include "backfill.dataVolumeName" .root }}
  mountPath: /data
{{- end }}
- name: tmp
  mountPath: /tmp
{{- if .root.Values.temporal.tls.clientCertSecret }}
- name: temporal-tls
  mountPath: /etc/temporal-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "backfill.volumes" -}}
{{- $root := .root -}}
- name: config
  configMap:
    name: {{ include "backfill.configMapName" $root }}
{{- if .data }}
{{- if eq $root.Values.fileStore.type "s3" }}
- name: usage
  {{- with $root.Values.fileStore.s3.usageJournalClaim }}
  persistentVolumeClaim:
    claimName: {{ . }}
  {{- else }}
  emptyDir: {}
  {{- end }}
{{- else }}
- name: files
  persistentVolumeClaim:
    claimName: {{ include "backfill.claimName" $root }}
{{- end }}
{{- end }}
- name: tmp
  emptyDir: {}
{{- if $root.Values.temporal.tls.clientCertSecret }}
- name: temporal-tls
  secret:
    secretName: {{ $root.Values.temporal.tls.clientCertSecret }}
{{- end }}
{{- end }}

{{- define "backfill.checkFileStore" -}}
{{- if eq .Values.fileStore.type "s3" }}
{{- if not .Values.fileStore.s3.bucket }}
{{- fail "fileStore.s3.bucket is required with fileStore.type s3: the name of an existing bucket (docs/storage.md)" }}
{{- end }}
{{- else if ne .Values.fileStore.type "pvc" }}
{{- fail (printf "fileStore.type %q is unknown: pvc (a shared POSIX volume) or s3 (an S3-compatible bucket)" .Values.fileStore.type) }}
{{- end }}
{{- end }}
