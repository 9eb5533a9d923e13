{{/* Names and labels shared by every template. */}}
{{- define "ps.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ps.selectorLabels" -}}
app.kubernetes.io/name: program-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ps.labels" -}}
{{ include "ps.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "ps.serviceAccountName" -}}
{{- default (include "ps.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The operator's permissions; the same rules serve a ClusterRole or per-namespace Roles. */}}
{{- define "ps.rules" -}}
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [configmaps, services]
  verbs: [get, list, watch, create, patch]
# The routers' peer secret: created once, never read (no get/list: the operator reads no Secret).
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create, patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch]
# Router pods are recognised through Deployment -> ReplicaSet -> Pod ownership, never by labels.
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [list]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch]
- apiGroups: [scheduling.program-router.dev]
  resources: [programschedulings]
  verbs: [get, list, watch]
- apiGroups: [scheduling.program-router.dev]
  resources: [programschedulings/status]
  verbs: [get, patch, update]
- apiGroups: [scheduling.program-router.dev]
  resources: [programschedulings/finalizers]
  verbs: [update]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}
