{{/* Names and labels shared by every template of the chart. */}}

{{- define "pdx-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pdx-operator.fullname" -}}
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

{{- define "pdx-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pdx-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdx-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of everything the release owns, without a component. */}}
{{- define "pdx-operator.commonLabels" -}}
helm.sh/chart: {{ include "pdx-operator.chart" . }}
app.kubernetes.io/name: {{ include "pdx-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pdx
{{- end }}

{{- define "pdx-operator.labels" -}}
{{ include "pdx-operator.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "pdx-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pdx-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: a tag, or a digest when the tag starts with sha256:. */}}
{{- define "pdx-operator.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if hasPrefix "sha256:" $tag }}
{{- printf "%s@%s" .Values.image.repository $tag }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* Peering is on when more than one replica runs. */}}
{{- define "pdx-operator.peered" -}}
{{- if gt (int .Values.replicaCount) 1 }}true{{- end }}
{{- end }}
