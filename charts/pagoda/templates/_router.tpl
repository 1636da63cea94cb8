{{/* Names and rules of `pagoda router` (router-*.yaml). */}}
{{- define "pagoda.routerName" -}}
{{- printf "%s-router" (include "pagoda.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The router's own ServiceAccount, or with serviceAccount.create off, router.serviceAccountName
(defaulting to the operator's). */}}
{{- define "pagoda.routerServiceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- include "pagoda.routerName" . -}}
{{- else -}}
{{- .Values.router.serviceAccountName | default (include "pagoda.serviceAccountName" .) -}}
{{- end -}}
{{- end -}}

{{- define "pagoda.routerSelectorLabels" -}}
app.kubernetes.io/name: pagoda-router
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pagoda.routerLabels" -}}
{{ include "pagoda.routerSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The router's base URL inside the cluster; the operator scrapes its /metrics there. */}}
{{- define "pagoda.routerURL" -}}
{{- printf "http://%s.%s.svc:%v" (include "pagoda.routerName" .) .Release.Namespace .Values.router.port -}}
{{- end -}}

{{/* Exactly the verbs the router uses. */}}
{{- define "pagoda.routerRules" -}}
# Discovery: the ModelServers (names, aliases, strategy) and their Services' ready endpoints.
- apiGroups: ["pagoda.dev"]
  resources: ["modelservers"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list", "watch"]
# Scale from zero: a held request raises the ModelServer's replicas to its minimum.
- apiGroups: ["pagoda.dev"]
  resources: ["modelservers/scale"]
  verbs: ["patch"]
# status.router: where each ModelServer is reached through the router.
- apiGroups: ["pagoda.dev"]
  resources: ["modelservers/status"]
  verbs: ["patch"]
{{- end -}}
