{{/* Chart name, truncated to a valid label value. */}}
{{- define "headrace-operator.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name of the release's objects. */}}
{{- define "headrace-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "headrace-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "headrace-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "headrace-operator.labels" -}}
{{ include "headrace-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The namespaces the operator watches, as a JSON list: watchNamespaces, else the
release's namespace; none with clusterWide (which forbids watchNamespaces).
*/}}
{{- define "headrace-operator.namespaces" -}}
{{- if .Values.clusterWide -}}
{{- if .Values.watchNamespaces -}}
{{- fail "clusterWide watches every namespace: leave watchNamespaces empty" -}}
{{- end -}}
[]
{{- else -}}
{{- default (list .Release.Namespace) .Values.watchNamespaces | toJson -}}
{{- end -}}
{{- end -}}

{{- define "headrace-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "headrace-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The operator's permissions: exactly the requests it makes (the chart's
README.md has a table of every verb with its reason).
- its custom resources: watched by kopf, patched for kopf's finalizer and
  annotations, status patched by the operator (never read through the status
  subresource); PChannelAssignments are created and deleted by the operator
  (server-side apply needs create and patch);
- the objects it builds for each cluster (node pods, the shared WAL volume, config,
  services, node ServiceAccount and Role, disruption budget);
- core/v1 events it records (kopf posts there too; nothing patches an event).
The Role it creates for the nodes grants only `get` on a ConfigMap, which the
operator holds itself (RBAC forbids granting more than one holds).
*/}}
{{- define "headrace-operator.rules" -}}
- apiGroups: ["streaming.headrace.io"]
  resources: ["streamingclusters", "upgradeplans"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["streaming.headrace.io"]
  resources: ["streamingclusters/status", "pchannelassignments/status", "upgradeplans/status"]
  verbs: ["patch"]
- apiGroups: ["streaming.headrace.io"]
  resources: ["pchannelassignments"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["configmaps", "services", "serviceaccounts"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["sparkoperator.k8s.io", "spark.apache.org"]
  resources: ["sparkapplications"]
  verbs: ["list", "create", "delete"]
{{- end -}}
