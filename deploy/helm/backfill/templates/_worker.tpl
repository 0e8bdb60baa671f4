{{/* A worker Deployment. Called with (dict "root" $ "suffix" name "role" all|workflows|activities
"replicas" n "resources" map). Role "all" is the unsplit worker (no role label or variable);
a workflows-only worker gets no store, usage journal, S3 credentials or upstream keys, because
it opens none of them (worker/main.py, running_worker). */}}
{{- define "backfill.workerDeployment" -}}
{{- $root := .root -}}
{{- $lines := ne .role "workflows" -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "backfill.fullname" $root }}-{{ .suffix }}
  labels:
    {{- include "backfill.labels" $root | nindent 4 }}
    app.kubernetes.io/component: worker
    {{- if ne .role "all" }}
    backfill.io/worker-role: {{ .role }}
    {{- end }}
spec:
  replicas: {{ .replicas }}
  selector:
    matchLabels:
      {{- include "backfill.selectorLabels" $root | nindent 6 }}
      app.kubernetes.io/component: worker
      {{- if ne .role "all" }}
      backfill.io/worker-role: {{ .role }}
      {{- end }}
  template:
    metadata:
      labels:
        {{- include "backfill.selectorLabels" $root | nindent 8 }}
        app.kubernetes.io/component: worker
        {{- if ne .role "all" }}
        backfill.io/worker-role: {{ .role }}
        {{- end }}
      annotations:
        checksum/config: {{ $root.Values.config.toml | sha256sum }}
        checksum/secrets: {{ print $root.Values.webhooks.key.value $root.Values.temporal.apiKey.value | sha256sum }}
    spec:
      terminationGracePeriodSeconds: {{ $root.Values.worker.terminationGracePeriodSeconds }}
      # backfill never talks to the Kubernetes API: no service-account token in the pod.
      automountServiceAccountToken: false
      {{- with $root.Values.serviceAccountName }}
      serviceAccountName: {{ . }}
      {{- end }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      containers:
        - name: worker
          image: {{ include "backfill.image" $root | quote }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args: ["worker"]
          env:
            {{- include "backfill.env" $root | nindent 12 }}
            {{- if and $lines (eq $root.Values.fileStore.type "s3") }}
            {{- include "backfill.storeEnv" $root | nindent 12 }}
            {{- end }}
            {{- if ne .role "all" }}
            - name: BACKFILL_WORKER_ROLE
              value: {{ .role | quote }}
            {{- end }}
            {{- if $lines }}
            {{- include "backfill.webhookKeyEnv" $root | nindent 12 }}
            - name: BACKFILL_WORKER_MAX_CONCURRENT_ACTIVITIES
              value: {{ $root.Values.worker.maxConcurrentActivities | quote }}
            {{- end }}
            {{- if eq .role "all" }}
            - name: BACKFILL_WORKER_EAGER_ACTIVITIES
              value: {{ $root.Values.worker.eagerActivities | quote }}
            {{- else }}
            # A split gives up eager lines: they need the workflow and the line in one worker.
            - name: BACKFILL_WORKER_EAGER_ACTIVITIES
              value: "0"
            {{- end }}
            - name: BACKFILL_WORKER_METRICS_PORT
              value: {{ $root.Values.worker.metricsPort | quote }}
            # The pod's own IP, not every interface.
            - name: BACKFILL_WORKER_METRICS_HOST
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            {{- with $root.Values.worker.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- if $lines }}
          {{- include "backfill.envFrom" (dict "root" $root "signs" true) | nindent 10 }}
          {{- end }}
          ports:
            - name: metrics
              containerPort: {{ $root.Values.worker.metricsPort }}
              protocol: TCP
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          resources:
            {{- toYaml .resources | nindent 12 }}
          volumeMounts:
            {{- include "backfill.volumeMounts" (dict "root" $root "data" $lines) | nindent 12 }}
      volumes:
        {{- include "backfill.volumes" (dict "root" $root "data" $lines) | nindent 8 }}
      {{- with $root.Values.worker.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $root.Values.worker.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $root.Values.worker.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}
