{{/* Names: a release called nvgpu-exporter renders the kustomize base's names. */}}
{{- define "nvgpu-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nvgpu-exporter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "nvgpu-exporter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "nvgpu-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nvgpu-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nvgpu-exporter.labels" -}}
helm.sh/chart: {{ include "nvgpu-exporter.chart" . }}
{{ include "nvgpu-exporter.selectorLabels" . }}
{{- /* the version that runs: the image tag when one is set */}}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "nvgpu-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "nvgpu-exporter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag (tag defaults to appVersion), or repository@digest. */}}
{{- define "nvgpu-exporter.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* Combinations that cannot work fail the render with the reason. */}}
{{- define "nvgpu-exporter.checks" -}}
{{- if .Values.restricted }}
{{- if .Values.podAttribution.runAsRoot }}
{{- fail "restricted: true forbids podAttribution.runAsRoot (Pod Security restricted requires runAsNonRoot); restricted turns pod attribution off" }}
{{- end }}
{{- if .Values.processAttribution.enabled }}
{{- fail "restricted: true forbids processAttribution.enabled (hostPID and a hostPath are not allowed by Pod Security baseline or restricted)" }}
{{- end }}
{{- if .Values.hostNetwork }}
{{- fail "restricted: true forbids hostNetwork (not allowed by Pod Security baseline or restricted)" }}
{{- end }}
{{- end }}
{{- if and .Values.processAttribution.enabled (not .Values.podAttribution.enabled) }}
{{- fail "processAttribution.enabled needs podAttribution.enabled: per-pod usage is part of pod attribution" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled .Values.podMonitor.enabled }}
{{- fail "serviceMonitor.enabled and podMonitor.enabled: choose one, or every exporter is scraped twice" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.service.enabled) }}
{{- fail "serviceMonitor.enabled needs service.enabled (the ServiceMonitor selects the Service); use podMonitor without a Service" }}
{{- end }}
{{- range $name, $mode := .Values.features }}
{{- if has $name (list "pod_attribution" "kernel_xid") }}
{{- fail (printf "features.%s: set by the chart (pod_attribution: podAttribution.enabled; kernel_xid needs the host's /dev/kmsg and stays off)" $name) }}
{{- end }}
{{- end }}
{{- end }}

{{/* A feature mode: true/false (YAML's on/off unquoted) become on/off. */}}
{{- define "nvgpu-exporter.featureMode" -}}
{{- if kindIs "bool" . }}{{ ternary "on" "off" . }}{{ else }}{{ . }}{{ end }}
{{- end }}

{{/* The scrape endpoint both monitors use (deploy/kubernetes/base/scrape-endpoint.yaml). */}}
{{- define "nvgpu-exporter.scrapeEndpoint" -}}
{{- $monitor := index . 1 }}
{{- with index . 0 }}
port: metrics
path: /metrics
scheme: {{ ternary "https" "http" .Values.webConfig.enabled }}
interval: {{ $monitor.interval }}
scrapeTimeout: {{ $monitor.scrapeTimeout }}
relabelings:
  - action: replace
    sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: node
  - action: replace
    sourceLabels: [__meta_kubernetes_pod_name]
    targetLabel: exporter_pod
  - action: replace
    sourceLabels: [__meta_kubernetes_pod_label_nvgpu_exporter_track]
    targetLabel: track
  {{- with $monitor.extraRelabelings }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  # The workload's namespace/pod/container labels must not be renamed exported_*: drop the
  # operator's target labels of the same names.
  - action: labeldrop
    regex: (namespace|pod|container|service|endpoint)
{{- if .Values.webConfig.enabled }}
{{- $secret := .Values.scrapeAuth.secretName }}
tlsConfig:
  serverName: {{ .Values.scrapeAuth.serverName | default (printf "%s.%s.svc" (include "nvgpu-exporter.fullname" .) .Release.Namespace) }}
  ca:
    secret:
      name: {{ $secret }}
      key: ca.crt
  {{- if .Values.scrapeAuth.mutualTLS }}
  cert:
    secret:
      name: {{ $secret }}
      key: tls.crt
  keySecret:
    name: {{ $secret }}
    key: tls.key
  {{- end }}
{{- if .Values.scrapeAuth.basicAuth }}
basicAuth:
  username:
    name: {{ $secret }}
    key: username
  password:
    name: {{ $secret }}
    key: password
{{- end }}
{{- end }}
{{- end }}
{{- end }}
