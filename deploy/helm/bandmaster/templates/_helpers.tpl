{{/*
The templates render the objects of the Kustomize base (deploy/kubernetes/base) and, with
values-simulated.yaml or values-sglang.yaml, of its overlays; tests/deploy/test_helm.py holds them equal.
*/}}

{{/* Labels of every object: the base's part-of label, and Helm's own. */}}
{{- define "bandmaster.labels" -}}
app.kubernetes.io/part-of: bandmaster
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Bandmaster's image: the chart's appVersion (the package version) unless a tag is given; never latest. */}}
{{- define "bandmaster.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if eq (toString $tag) "latest" -}}
{{- fail "image.tag: pin a version, not latest" -}}
{{- end -}}
{{- printf "%s:%s" .Values.image.repository (toString $tag) -}}
{{- end -}}

{{/* The worker-model ConfigMap's name carries a hash of its content (as Kustomize's generator does), so a
new model rolls the worker and planner pods that read it. */}}
{{- define "bandmaster.workerModel" -}}
{{- printf "worker-model-%s" (.Values.model | toJson | sha256sum | trunc 10) -}}
{{- end -}}

{{/* storageClassName of a claim, when one is given ("" = the cluster's default class). */}}
{{- define "bandmaster.storageClass" -}}
{{- if . }}
  storageClassName: {{ . | quote }}
{{- end }}
{{- end -}}
