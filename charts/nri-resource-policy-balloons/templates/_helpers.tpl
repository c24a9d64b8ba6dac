{{/*
Common labels
*/}}
{{- define "nri-plugin.labels" -}}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{ include "nri-plugin.selectorLabels" . }}
{{- end -}}

{{/*
Selector labels
*/}}
{{- define "nri-plugin.selectorLabels" -}}
app.kubernetes.io/name: nri-resource-policy-balloons
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The instrumentation port: the digits after the last ':' of
config.instrumentation.httpEndpoint (":8891" -> "8891"), or "" when unset.
*/}}
{{- define "nri-plugin.httpPort" -}}
{{- $ep := "" -}}
{{- with .Values.config.instrumentation -}}{{- $ep = .httpEndpoint | default "" -}}{{- end -}}
{{- if regexMatch ":[0-9]+$" $ep -}}
{{- regexReplaceAll "^.*:([0-9]+)$" $ep "${1}" -}}
{{- end -}}
{{- end -}}

{{/*
The SST helper's ZeroMQ endpoint, in the emptyDir shared by both containers.
*/}}
{{- define "nri-plugin.sstSocket" -}}
ipc:///run/nri-sst/helper.sock
{{- end -}}
