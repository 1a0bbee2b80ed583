{{/* Chart name, truncated to a DNS label. */}}
{{- define "apo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release fullname: the Deployment, the webhook Service and, by default, the webhook
configurations and the peering object are named after it. */}}
{{- define "apo.fullname" -}}
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

{{/* "<fullname>-<suffix>", kept within 63 characters. Call with (list . "suffix"). */}}
{{- define "apo.suffixed" -}}
{{- $root := index . 0 }}
{{- $suffix := index . 1 }}
{{- $max := sub 62 (len $suffix) | int }}
{{- printf "%s-%s" (include "apo.fullname" $root | trunc $max | trimSuffix "-") $suffix }}
{{- end }}

{{- define "apo.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "apo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "apo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The labels of the chart's Pods. */}}
{{- define "apo.podLabels" -}}
helm.sh/chart: {{ include "apo.chart" . }}
{{ include "apo.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: admission-policy-operator
{{- end }}

{{/* The labels of every object the chart writes. The break-glass label lets whoever installs the
chart, when a breakGlass identity (system:masters by default), install, upgrade and uninstall it
whatever policies are in place; for anyone else it is an ordinary label. Pods go without it: the
controllers create them, in the release namespace, which no webhook judges anyway. */}}
{{- define "apo.labels" -}}
{{ include "apo.podLabels" . }}
policy-operator.dev/exempt: "true"
{{- end }}

{{/* The users whose break-glass writes no webhook judges: breakGlass.users and the operator's own
ServiceAccount (its Reports carry the label). */}}
{{- define "apo.breakGlassUsers" -}}
{{- $own := printf "system:serviceaccount:%s:%s" .Release.Namespace (include "apo.serviceAccountName" .) }}
{{- join "," (uniq (append .Values.breakGlass.users $own)) }}
{{- end }}

{{- define "apo.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "apo.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The webhook Service (AP_SERVICE_NAME). */}}
{{- define "apo.webhookServiceName" -}}
{{- include "apo.fullname" . }}
{{- end }}

{{- define "apo.metricsServiceName" -}}
{{- include "apo.suffixed" (list . "metrics") }}
{{- end }}

{{/* Name of both webhook configurations (AP_WEBHOOK_CONFIG_NAME). */}}
{{- define "apo.webhookConfigName" -}}
{{- default (include "apo.fullname" .) .Values.webhook.configName }}
{{- end }}

{{/* Secret with the CA and serving certificate (AP_CERT_SECRET). */}}
{{- define "apo.certSecretName" -}}
{{- default (include "apo.suffixed" (list . "tls")) .Values.webhook.certSecretName }}
{{- end }}

{{/* ClusterKopfPeering object name (AP_PEERING_NAME). */}}
{{- define "apo.peeringName" -}}
{{- default (include "apo.fullname" .) .Values.peering.name }}
{{- end }}

{{/* Cluster-scoped RBAC objects are named after the namespace too: two releases with the same
name in different namespaces must not share (or fight over) a ClusterRole. */}}
{{- define "apo.clusterRoleName" -}}
{{- printf "%s-%s" .Release.Namespace (include "apo.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Role and RoleBinding in namespace "default" for the operator's events about (cluster-scoped)
AdmissionPolicies: named after the release namespace too, so that releases never share them. */}}
{{- define "apo.eventsRoleName" -}}
{{- printf "%s-%s" .Release.Namespace (include "apo.suffixed" (list . "events")) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "apo.cleanupName" -}}
{{- include "apo.suffixed" (list . "cleanup") }}
{{- end }}

{{- define "apo.cleanupClusterRoleName" -}}
{{- printf "%s-%s" .Release.Namespace (include "apo.cleanupName" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "apo.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* featureGates {Name: bool} as the operator's --feature-gates text, Name=true,Other=false (sorted). */}}
{{- define "apo.featureGates" -}}
{{- $gates := list }}
{{- range $name, $enabled := .Values.featureGates }}
{{- $gates = append $gates (printf "%s=%t" $name $enabled) }}
{{- end }}
{{- join "," $gates }}
{{- end }}

{{/* Values the schema cannot express. */}}
{{- define "apo.validate" -}}
{{- $ports := list (int .Values.webhook.port) (int .Values.health.port) }}
{{- if .Values.metrics.enabled }}
{{- $ports = append $ports (int .Values.metrics.port) }}
{{- end }}
{{- if ne (len $ports) (len (uniq $ports)) }}
{{- fail (printf "webhook.port, health.port and metrics.port must be distinct, got %v" $ports) }}
{{- end }}
{{- $minAvailable := .Values.podDisruptionBudget.minAvailable }}
{{- if and .Values.podDisruptionBudget.enabled (gt (int .Values.replicaCount) 1) (kindIs "float64" $minAvailable) }}
{{- if ge (int $minAvailable) (int .Values.replicaCount) }}
{{- fail (printf "podDisruptionBudget.minAvailable (%d) must be lower than replicaCount (%d), or no node could ever be drained" (int $minAvailable) (int .Values.replicaCount)) }}
{{- end }}
{{- end }}
{{- end }}
