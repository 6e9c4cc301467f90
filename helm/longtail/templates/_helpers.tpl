{{/*
Names, labels and small computed values shared by the chart's templates.
*/}}

{{- define "longtail.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "longtail.fullname" -}}
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

{{- define "longtail.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "longtail.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: longtail
{{- end -}}

{{- define "longtail.selectorLabels" -}}
app.kubernetes.io/name: {{ include "longtail.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "longtail.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "longtail.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false (name an existing ServiceAccount)" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "longtail.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Namespaces watched in namespaced scope, as a list (default: the release namespace). */}}
{{- define "longtail.watchNamespaces" -}}
{{- $ns := .Values.rbac.watchNamespaces | default (list .Release.Namespace) -}}
{{- toJson $ns -}}
{{- end -}}


{{- /* A label map as comma-separated key=value pairs (sorted), for LONGTAIL_OPERATOR_* lists. */ -}}
{{- define "longtail.labelList" -}}
{{- $pairs := list -}}
{{- range $k, $v := . -}}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
