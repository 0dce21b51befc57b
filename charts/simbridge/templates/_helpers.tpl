{{/*
Standard name helpers (prometheus-community style).
*/}}

{{/* Chart name, overridable with nameOverride. */}}
{{- define "simbridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name. Truncated to 52 characters (not 63): a StatefulSet adds
"-<ordinal>" to pod names and "-<10-char hash>" to the controller-revision-hash label value,
both of which must stay within 63 characters.
*/}}
{{- define "simbridge.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "simbridge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "simbridge.labels" -}}
helm.sh/chart: {{ include "simbridge.chart" . }}
{{ include "simbridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: simbridge
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels: immutable on a StatefulSet, so keep them minimal and stable. */}}
{{- define "simbridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "simbridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Name of the bridge's ServiceAccount. */}}
{{- define "simbridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "simbridge.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Name of the resizer's ServiceAccount. */}}
{{- define "simbridge.resizerServiceAccountName" -}}
{{- if .Values.resizer.serviceAccount.create }}
{{- default (printf "%s-resizer" (include "simbridge.fullname" .)) .Values.resizer.serviceAccount.name }}
{{- else }}
{{- required "resizer.serviceAccount.name is required when resizer.serviceAccount.create is false" .Values.resizer.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Headless Service name (the StatefulSet's serviceName; gives each replica a DNS name). */}}
{{- define "simbridge.headlessServiceName" -}}
{{- printf "%s-headless" (include "simbridge.fullname" .) }}
{{- end }}

{{/* True (non-empty) when the workload is a StatefulSet. */}}
{{- define "simbridge.isStatefulSet" -}}
{{- if eq .Values.workload.kind "StatefulSet" }}true{{ end }}
{{- end }}

{{/* Container image reference: repository[:tag][@digest]; the tag defaults to appVersion (+"-gpu"). */}}
{{- define "simbridge.image" -}}
{{- $tag := .Values.image.tag }}
{{- if not $tag }}
{{- $tag = ternary (printf "%s-gpu" .Chart.AppVersion) .Chart.AppVersion (eq .Values.image.variant "gpu") }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* PriorityClass name the pod uses ("" = none). */}}
{{- define "simbridge.priorityClassName" -}}
{{- if .Values.priorityClass.create }}
{{- default (printf "%s-%s" .Release.Namespace (include "simbridge.fullname" .)) .Values.priorityClass.name }}
{{- else }}
{{- .Values.priorityClass.name }}
{{- end }}
{{- end }}

{{/* ResourceClaimTemplate name used by the pod in dra.mode=claimTemplate. */}}
{{- define "simbridge.claimTemplateName" -}}
{{- if .Values.dra.claimTemplate.create }}
{{- printf "%s-gpu" (include "simbridge.fullname" .) }}
{{- else }}
{{- required "dra.claimTemplate.existingName is required when dra.claimTemplate.create is false" .Values.dra.claimTemplate.existingName }}
{{- end }}
{{- end }}

{{/*
Pod names RBAC may be restricted to (resourceNames): one per StatefulSet ordinal, up to
autoscaling.maxReplicas when the HPA owns the replica count.
Empty output = no restriction (Deployment, or rbac.restrictToOwnPods=false).
*/}}
{{- define "simbridge.ownPodNames" -}}
{{- if and .Values.rbac.restrictToOwnPods (include "simbridge.isStatefulSet" .) }}
{{- $fullname := include "simbridge.fullname" . }}
{{- $replicas := int .Values.replicas }}
{{- if .Values.autoscaling.enabled }}
{{- $replicas = max $replicas (int .Values.autoscaling.maxReplicas) }}
{{- end }}
{{- range $i := until (int (max 1 $replicas)) }}
- {{ printf "%s-%d" $fullname $i | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* Total seconds the kubelet waits after SIGTERM: preStop sleep + drain grace + margin. */}}
{{- define "simbridge.terminationGracePeriodSeconds" -}}
{{- add (int .Values.shutdown.preStopSleepSeconds) (int .Values.bridge.drainGraceSeconds) (int .Values.shutdown.terminationMarginSeconds) }}
{{- end }}

{{/*
requests/limits for cpu and memory under the chosen QoS class.
Input: dict "qos" ("Guaranteed"|"Burstable"), "res" ({requests, limits}), "path" (values path, for messages).
Guaranteed: requests are copied from limits (so they are equal by construction); explicit requests
must be written identically. Burstable: requests are required; cpu and memory limits must not both
equal the requests, or Kubernetes would compute Guaranteed (and QoS can never change on resize).
Output: a YAML mapping with "requests" and/or "limits" (cpu/memory only).
*/}}
{{- define "simbridge.cpuMemory" -}}
{{- $qos := .qos }}
{{- $path := .path }}
{{- $req := default dict .res.requests }}
{{- $lim := default dict .res.limits }}
{{- $out := dict }}
{{- if eq $qos "Guaranteed" }}
{{- range $k := list "cpu" "memory" }}
{{- if not (hasKey $lim $k) }}
{{- fail (printf "qosClass=Guaranteed needs %s.limits.%s (requests are copied from limits)" $path $k) }}
{{- end }}
{{- if and (hasKey $req $k) (ne (toString (get $req $k)) (toString (get $lim $k))) }}
{{- fail (printf "qosClass=Guaranteed needs %s.requests.%s == %s.limits.%s (got %v and %v); write them identically or leave requests empty" $path $k $path $k (get $req $k) (get $lim $k)) }}
{{- end }}
{{- end }}
{{- $l := dict "cpu" (toString $lim.cpu) "memory" (toString $lim.memory) }}
{{- $_ := set $out "requests" $l }}
{{- $_ := set $out "limits" $l }}
{{- else }}
{{- range $k := list "cpu" "memory" }}
{{- if not (hasKey $req $k) }}
{{- fail (printf "qosClass=Burstable needs %s.requests.%s" $path $k) }}
{{- end }}
{{- end }}
{{- if and (hasKey $lim "cpu") (hasKey $lim "memory") (eq (toString $req.cpu) (toString $lim.cpu)) (eq (toString $req.memory) (toString $lim.memory)) }}
{{- fail (printf "qosClass=Burstable but %s.requests == %s.limits for cpu and memory: Kubernetes would compute Guaranteed; use qosClass=Guaranteed or make them differ" $path $path) }}
{{- end }}
{{- $r := dict "cpu" (toString $req.cpu) "memory" (toString $req.memory) }}
{{- $_ := set $out "requests" $r }}
{{- $l := dict }}
{{- range $k := list "cpu" "memory" }}
{{- if hasKey $lim $k }}
{{- $_ := set $l $k (toString (get $lim $k)) }}
{{- end }}
{{- end }}
{{- if $l }}
{{- $_ := set $out "limits" $l }}
{{- end }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/*
The bridge container's resources block (without the "resources:" key).
- container level (default): cpu/memory per qosClass, plus the DRA extended resource or claim;
- pod level (podResources.enabled): cpu/memory live in pod.spec.resources; the container keeps
  only the DRA extended resource / claim, and inherits the pod limits in its own cgroup.
*/}}
{{- define "simbridge.containerResources" -}}
{{- $out := dict }}
{{- if not .Values.podResources.enabled }}
{{- $out = include "simbridge.cpuMemory" (dict "qos" .Values.qosClass "res" .Values.resources "path" "resources") | fromYaml }}
{{- end }}
{{- if .Values.dra.enabled }}
{{- if eq .Values.dra.mode "extendedResource" }}
{{- $lim := default dict (get $out "limits") }}
{{- $_ := set $lim .Values.dra.extendedResource.name (toString .Values.dra.extendedResource.count) }}
{{- $_ := set $out "limits" $lim }}
{{- else }}
{{- $_ := set $out "claims" (list (dict "name" .Values.dra.claimTemplate.podClaimName)) }}
{{- end }}
{{- end }}
{{- if $out }}
{{- toYaml $out }}
{{- end }}
{{- end }}

{{/* Secret holding the edges' bearer token: existing, or "<fullname>-auth" made by the chart. */}}
{{- define "simbridge.authSecretName" -}}
{{- default (printf "%s-auth" (include "simbridge.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/* Secret with the ingest certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "simbridge.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "simbridge.fullname" .)) .Values.tls.existingSecret }}
{{- end }}

{{/* Secret with the sink's CA (and the client pair). */}}
{{- define "simbridge.sinkTlsSecretName" -}}
{{- default (printf "%s-sink-tls" (include "simbridge.fullname" .)) .Values.sinkTLS.existingSecret }}
{{- end }}

{{/*
Labels of the `helm test` Pod. Deliberately NOT the selector labels: the Services must never route
edges to it.
*/}}
{{- define "simbridge.testLabels" -}}
app.kubernetes.io/name: {{ printf "%s-test" (include "simbridge.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* parentRefs of the Gateway API routes: the chart's own Gateway, or gatewayAPI.parentRefs. */}}
{{- define "simbridge.routeParentRefs" -}}
{{- if .Values.gatewayAPI.gateway.create }}
- name: {{ include "simbridge.fullname" . }}
  sectionName: https
{{- else }}
{{- if not .Values.gatewayAPI.parentRefs }}
{{- fail "gatewayAPI.parentRefs is required for the routes when gatewayAPI.gateway.create is false" }}
{{- end }}
{{- toYaml .Values.gatewayAPI.parentRefs }}
{{- end }}
{{- end }}

{{/*
The routing key: the header (WebSocket upgrade) and gRPC metadata key carrying the device id, which
load balancers hash so that each device reaches one replica. The SDK sends it; the bridge refuses a
Hello whose device id differs from it.
*/}}
{{- define "simbridge.deviceHeader" -}}
x-simbridge-device
{{- end }}
