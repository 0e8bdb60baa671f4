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
{{- if .Values.temporal.apiKey.existingSecret }}
- name: TEMPORAL_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.temporal.apiKey.existingSecret }}
      key: {{ .Values.temporal.apiKey.key }}
{{- end }}
{{- end }}

{{- define "backfill.envFrom" -}}
{{- if .Values.upstreamKeys.existingSecret }}
envFrom:
  - secretRef:
      name: {{ .Values.upstreamKeys.existingSecret }}
{{- end }}
{{- end }}

{{- define "backfill.volumeMounts" -}}
- name: config
  mountPath: /etc/backfill
  readOnly: true
- name: files
  mountPath: /data
- name: tmp
  mountPath: /tmp
{{- if .Values.temporal.tls.clientCertSecret }}
- name: temporal-tls
  mountPath: /etc/temporal-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "backfill.volumes" -}}
- name: config
  configMap:
    name: {{ include "backfill.configMapName" . }}
- name: files
  persistentVolumeClaim:
    claimName: {{ include "backfill.claimName" . }}
- name: tmp
  emptyDir: {}
{{- if .Values.temporal.tls.clientCertSecret }}
- name: temporal-tls
  secret:
    secretName: {{ .Values.temporal.tls.clientCertSecret }}
{{- end }}
{{- end }}

{{- define "backfill.checkFileStore" -}}
{{- if ne .Values.fileStore.type "pvc" }}
{{- fail (printf "fileStore.type %q is not supported yet: backfill's file store is a shared POSIX volume (fileStore.type: pvc)" .Values.fileStore.type) }}
{{- end }}
{{- end }}
