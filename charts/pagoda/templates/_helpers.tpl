{{- define "pagoda.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pagoda.labels" -}}
app.kubernetes.io/name: pagoda-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "pagoda.selectorLabels" -}}
app.kubernetes.io/name: pagoda-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pagoda.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pagoda.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The rules of the operator's role: exactly the verbs the code uses, and why. */}}
{{- define "pagoda.rules" -}}
# kopf watches ModelServers and patches them (its annotations and the finalizer); child events
# read their parent (get).
- apiGroups: ["pagoda.dev"]
  resources: ["modelservers"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["pagoda.dev"]
  resources: ["modelservers/status"]
  verbs: ["patch"]
# Children carry an owner reference with blockOwnerDeletion; OwnerReferencesPermissionEnforcement
# (OpenShift, hardened clusters) admits one only from a user who may update the owner's finalizers.
- apiGroups: ["pagoda.dev"]
  resources: ["modelservers/finalizers"]
  verbs: ["update"]
# The autoscaler writes replicas through the scale subresource.
- apiGroups: ["pagoda.dev"]
  resources: ["modelservers/scale"]
  verbs: ["patch"]
# The cache claim: created once, grown when cache.size grows, its owner reference kept in step
# with retainOnDelete, deleted by the finalizer unless retainOnDelete.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "create", "patch", "delete"]
# The loader Job: watched for completion, stale ones pruned, failed ones deleted to retry.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# The loader's plan figures (termination message) and the autoscaler's scrape targets.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments/scale"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Node drains take the serving pods one at a time.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch"]
# scaling.mode hpa / keda.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["keda.sh"]
  resources: ["scaledobjects"]
  verbs: ["get", "list", "create", "patch", "delete"]
# routing.inferencePool: the Gateway API Inference Extension's pool (where its CRD is installed).
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "create", "patch", "delete"]
{{- end -}}
