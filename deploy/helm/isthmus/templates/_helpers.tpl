{{- define "isthmus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "isthmus.fullname" -}}
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

{{- define "isthmus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "isthmus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The API server pods (not the migration hook's, which share the release labels). */}}
{{- define "isthmus.serverSelectorLabels" -}}
{{ include "isthmus.selectorLabels" . }}
app.kubernetes.io/component: server
{{- end -}}

{{/* The control loop's pods (control.separate): `isthmus control`, no API. */}}
{{- define "isthmus.controlSelectorLabels" -}}
{{ include "isthmus.selectorLabels" . }}
app.kubernetes.io/component: control
{{- end -}}

{{- define "isthmus.controlName" -}}
{{- printf "%s-control" (include "isthmus.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "isthmus.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "isthmus.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: isthmus
{{- end -}}

{{- define "isthmus.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "isthmus.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "isthmus.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The API port: the config's listener port. */}}
{{- define "isthmus.port" -}}
{{- (.Values.config.server | default dict).port | default 8080 -}}
{{- end -}}

{{/*
Namespaces the Kubernetes backend works in, as JSON {namespace: uses Volcano PodGroups}:
settings.namespace of every k8s backend of the config that talks to this cluster (no
settings.kubeconfig), plus rbac.extraNamespaces. One home for the rule, so the Roles follow
the config.
*/}}
{{- define "isthmus.targetNamespaces" -}}
{{- $ns := dict -}}
{{- range .Values.config.backends -}}
{{- $s := .settings | default dict -}}
{{- if and (eq .kind "k8s") (not $s.kubeconfig) -}}
{{- $name := $s.namespace | default "isthmus" -}}
{{- if not (contains "{team}" $name) -}}
{{- $volcano := false -}}
{{- range $pool, $mode := ($s.modes | default dict) -}}
{{- if eq $mode "volcano" }}{{ $volcano = true }}{{ end -}}
{{- end -}}
{{- $_ := set $ns $name (or (get $ns $name) $volcano) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range .Values.rbac.extraNamespaces -}}
{{- if not (hasKey $ns .) }}{{ $_ := set $ns . false }}{{ end -}}
{{- end -}}
{{- toJson $ns -}}
{{- end -}}

{{/* ISTHMUS_DATABASE_URL from the Secret (or inline for trials). */}}
{{- define "isthmus.databaseEnv" -}}
- name: ISTHMUS_DATABASE_URL
{{- if .Values.database.existingSecret }}
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.existingSecret }}
      key: {{ .Values.database.secretKey }}
{{- else }}
  value: {{ .Values.database.url | quote }}
{{- end }}
{{- end -}}

{{/* The env of the servers and the control pods: the database URL, the tokens, extraEnv. */}}
{{- define "isthmus.env" -}}
{{ include "isthmus.databaseEnv" . }}
{{- range .Values.tokens }}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .key }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "isthmus.volumeMounts" -}}
- name: config
  mountPath: /etc/isthmus
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "isthmus.volumes" -}}
- name: config
  configMap:
    name: {{ include "isthmus.fullname" . }}
- name: tmp
  emptyDir: {sizeLimit: 64Mi}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Checks that cannot be said in the JSON schema. */}}
{{- define "isthmus.validate" -}}
{{- if and (not .Values.database.existingSecret) (not .Values.database.url) -}}
{{- fail "database: give database.existingSecret (a Secret with the URL) or database.url" -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) (hasPrefix "sqlite" .Values.database.url) -}}
{{- fail "replicaCount > 1 needs PostgreSQL: SQLite allows one server process" -}}
{{- end -}}
{{- if .Values.control.separate -}}
{{- if hasPrefix "sqlite" .Values.database.url -}}
{{- fail "control.separate needs PostgreSQL: `isthmus control` refuses SQLite (the server is the one process on the database file); keep control.separate false" -}}
{{- end -}}
{{- $loop := .Values.config.control | default dict -}}
{{- if and (hasKey $loop "enabled") (not $loop.enabled) -}}
{{- fail "control.separate: config.control.enabled is false, and `isthmus control` refuses to start without it" -}}
{{- end -}}
{{- if (.Values.config.server | default dict).metrics_auth -}}
{{- fail "control.separate: config.server.metrics_auth is on, and the metrics listener of `isthmus control` has no authentication (it refuses any address but loopback, where neither the probes nor Prometheus reach it); turn metrics_auth off or keep control.separate false" -}}
{{- end -}}
{{- end -}}
{{- if hasKey .Values.config "database" -}}
{{- fail "config.database: leave the URL out of the ConfigMap; use database.existingSecret" -}}
{{- end -}}
{{- if has ((.Values.config.server | default dict).host | default "") (list "127.0.0.1" "localhost" "::1") -}}
{{- fail "config.server.host: a loopback listener is unreachable from the Service and the probes; use 0.0.0.0" -}}
{{- end -}}
{{- if eq ((.Values.config.auth | default dict).mode | default "token") "none" -}}
{{- fail "config.auth.mode: 'none' is refused off loopback; configure tokens or oidc" -}}
{{- end -}}
{{- end -}}

{{/* "true" when a Kubernetes backend of this cluster gives each team its own namespace
(settings namespace: "isthmus-{team}"): those namespaces do not exist yet, so the backend's
rights there can only be granted cluster-wide. */}}
{{- define "isthmus.perTeamNamespaces" -}}
{{- $per := false -}}
{{- range .Values.config.backends -}}
{{- $s := .settings | default dict -}}
{{- if and (eq .kind "k8s") (not $s.kubeconfig) (contains "{team}" ($s.namespace | default "isthmus")) -}}
{{- $per = true -}}
{{- end -}}
{{- end -}}
{{- $per -}}
{{- end -}}

{{/* Namespaces (or namespace templates with {team}) of the k8s backends on this cluster that
have a pool in kueue mode: the backend lists and watches Kueue's Workloads there. */}}
{{- define "isthmus.kueueNamespaces" -}}
{{- $ns := list -}}
{{- range .Values.config.backends -}}
{{- $s := .settings | default dict -}}
{{- if and (eq .kind "k8s") (not $s.kubeconfig) -}}
{{- range $pool, $mode := ($s.modes | default dict) -}}
{{- if eq $mode "kueue" }}{{ $ns = append $ns ($s.namespace | default "isthmus") }}{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson (uniq $ns) -}}
{{- end -}}
