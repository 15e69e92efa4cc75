{{/*
Names, labels and shared snippets of the ha-controller chart.
*/}}

{{- define "ha-controller.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name prefix. Kept to 20 characters so that "<fullname>-<group>-headless"
and the pod names "<fullname>-<group>-<ordinal>" stay valid DNS labels.
*/}}
{{- define "ha-controller.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 20 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 20 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 20 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ha-controller.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ha-controller.labels" -}}
helm.sh/chart: {{ include "ha-controller.chart" . }}
{{ include "ha-controller.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ha-controller
{{- end }}

{{- define "ha-controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ha-controller.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Nameserver names and labels. Context: the root context ($). */}}
{{- define "ha-controller.nameserver.fullname" -}}
{{- printf "%s-nameserver" (include "ha-controller.fullname" .) }}
{{- end }}

{{- define "ha-controller.nameserver.headless" -}}
{{- printf "%s-nameserver-headless" (include "ha-controller.fullname" .) }}
{{- end }}

{{- define "ha-controller.nameserver.selectorLabels" -}}
{{ include "ha-controller.selectorLabels" . }}
app.kubernetes.io/component: nameserver
{{- end }}

{{/*
Every nameserver pod by its stable DNS name, comma-separated: brokers register
with all of them (namesrv_addrs).
*/}}
{{- define "ha-controller.namesrvAddrs" -}}
{{- $fullname := include "ha-controller.nameserver.fullname" . }}
{{- $headless := include "ha-controller.nameserver.headless" . }}
{{- $addrs := list }}
{{- range $i := until (int .Values.nameserver.replicas) }}
{{- $addrs = append $addrs (printf "%s-%d.%s.%s.svc.%s:9876" $fullname $i $headless $.Release.Namespace $.Values.clusterDomain) }}
{{- end }}
{{- join "," $addrs }}
{{- end }}

{{/* The client Service address, for tools (hactl groups, helm test). */}}
{{- define "ha-controller.namesrvService" -}}
{{- printf "%s.%s.svc.%s:9876" (include "ha-controller.nameserver.fullname" .) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/*
hactl's TLS flags for the release's TLS Secret mounted at /etc/ha-controller/tls
(the `helm test` pod, NOTES): the CA that verifies the servers and, under mutual
TLS, the client certificate. Empty without TLS; otherwise starts with a space.
*/}}
{{- define "ha-controller.hactlTlsFlags" -}}
{{- if .Values.tls.enabled }}
{{- print " --tls-ca /etc/ha-controller/tls/ca.crt" }}
{{- if .Values.tls.requireClientCert }}
{{- print " --tls-cert /etc/ha-controller/tls/tls.crt --tls-key /etc/ha-controller/tls/tls.key" }}
{{- end }}
{{- end }}
{{- end }}

{{/* etcd of controller mode (controller.etcd.deploy). Context: $. */}}
{{- define "ha-controller.etcd.fullname" -}}
{{- printf "%s-etcd" (include "ha-controller.fullname" .) }}
{{- end }}

{{- define "ha-controller.etcd.selectorLabels" -}}
{{ include "ha-controller.selectorLabels" . }}
app.kubernetes.io/component: etcd
{{- end }}

{{/*
The etcd endpoints of controller mode, comma-separated: every member of the chart's
etcd by its pod DNS name (controller.etcd.deploy), else controller.etcdEndpoints.
Empty: controller mode is off. Context: $.
*/}}
{{- define "ha-controller.etcdEndpoints" -}}
{{- if .Values.controller.etcd.deploy }}
{{- $name := include "ha-controller.etcd.fullname" . }}
{{- $addrs := list }}
{{- range $i := until (int .Values.controller.etcd.replicas) }}
{{- $addrs = append $addrs (printf "%s-%d.%s-headless.%s.svc.%s:2379" $name $i $name $.Release.Namespace $.Values.clusterDomain) }}
{{- end }}
{{- join "," $addrs }}
{{- else if kindIs "slice" .Values.controller.etcdEndpoints }}
{{- join "," .Values.controller.etcdEndpoints }}
{{- else }}
{{- .Values.controller.etcdEndpoints }}
{{- end }}
{{- end }}

{{/* Broker group names and labels. Context: dict "root" $ "group" $group. */}}
{{- define "ha-controller.group.fullname" -}}
{{- printf "%s-%s" (include "ha-controller.fullname" .root) .group.name }}
{{- end }}

{{- define "ha-controller.group.headless" -}}
{{- printf "%s-%s-headless" (include "ha-controller.fullname" .root) .group.name }}
{{- end }}

{{- define "ha-controller.group.selectorLabels" -}}
{{ include "ha-controller.selectorLabels" .root }}
app.kubernetes.io/component: broker
ha-controller.io/group: {{ .group.name }}
{{- end }}

{{- define "ha-controller.image" -}}
{{- printf "%s:%s" .Values.image.repository (toString (default .Chart.AppVersion .Values.image.tag)) }}
{{- end }}

{{- define "ha-controller.clusterSecretName" -}}
{{- default (printf "%s-auth" (include "ha-controller.fullname" .)) .Values.clusterSecret.existingSecret }}
{{- end }}

{{- define "ha-controller.adminTokenSecretName" -}}
{{- default (printf "%s-auth" (include "ha-controller.fullname" .)) .Values.adminToken.existingSecret }}
{{- end }}

{{/*
Pod anti-affinity. Context: dict "mode" soft|hard|none "topologyKey" K "labels" (selector label YAML).
*/}}
{{- define "ha-controller.podAntiAffinity" -}}
{{- if eq .mode "hard" }}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: {{ .topologyKey }}
      labelSelector:
        matchLabels:
          {{- .labels | nindent 10 }}
{{- else if eq .mode "soft" }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: {{ .topologyKey }}
        labelSelector:
          matchLabels:
            {{- .labels | nindent 12 }}
{{- end }}
{{- end }}

{{/*
Environment shared by nameservers and brokers: secrets as HAC_<KEY> variables
(the config loader reads every key from the environment), never in the ConfigMap.
*/}}
{{- define "ha-controller.secretEnv" -}}
{{- if .Values.clusterSecret.enabled }}
- name: HAC_CLUSTER_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "ha-controller.clusterSecretName" . }}
      key: {{ .Values.clusterSecret.key }}
{{- end }}
{{- if .Values.adminToken.enabled }}
- name: HAC_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "ha-controller.adminTokenSecretName" . }}
      key: {{ .Values.adminToken.key }}
{{- end }}
{{- end }}

{{/* The [tls] table both components render when TLS is on. Context: $. */}}
{{- define "ha-controller.tlsTable" -}}
{{- $tls := dict }}
{{- $_ := set $tls "enabled" true }}
{{- $_ := set $tls "cert_file" "/etc/ha-controller/tls/tls.crt" }}
{{- $_ := set $tls "key_file" "/etc/ha-controller/tls/tls.key" }}
{{- /* every outgoing connection (peers, nameservers, the HA master) verifies the
server against the release's CA, with or without mutual TLS */}}
{{- $_ := set $tls "ca_file" "/etc/ha-controller/tls/ca.crt" }}
{{- if .Values.tls.requireClientCert }}
{{- $_ := set $tls "require_client_cert" true }}
{{- end }}
{{- toYaml $tls }}
{{- end }}

{{/* The [acl] table both components render when the client ACL is on; the users
file comes from the Secret acl.existingSecret, mounted read-only. Context: $. */}}
{{- define "ha-controller.aclTable" -}}
{{- $acl := dict }}
{{- $_ := set $acl "enabled" true }}
{{- $_ := set $acl "allow_anonymous" .Values.acl.allowAnonymous }}
{{- $_ := set $acl "file" (printf "/etc/ha-controller/acl/%s" .Values.acl.key) }}
{{- toYaml $acl }}
{{- end }}

{{/*
A map of config keys as TOML: scalars and arrays first, then one [table] per
nested map. Go templates range over maps in key order, so the output is stable.
Helm reads YAML numbers as float64; config values are whole numbers, so they
are printed as integers.
*/}}
{{- define "ha-controller.toml" -}}
{{- range $key, $value := . }}
{{- if not (kindIs "map" $value) }}
{{ $key }} = {{ include "ha-controller.tomlValue" $value }}
{{- end }}
{{- end }}
{{- range $key, $value := . }}
{{- if kindIs "map" $value }}

[{{ $key }}]
{{- range $k, $v := $value }}
{{ $k }} = {{ include "ha-controller.tomlValue" $v }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ha-controller.tomlValue" -}}
{{- if kindIs "string" . }}
{{- toJson . }}
{{- else if kindIs "bool" . }}
{{- ternary "true" "false" . }}
{{- else if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) }}
{{- int64 . }}
{{- else if kindIs "slice" . }}
{{- $items := list }}
{{- range . }}
{{- $items = append $items (toJson (toString .)) }}
{{- end }}
{{- printf "[%s]" (join ", " $items) }}
{{- else }}
{{- fail (printf "cannot render %v (%s) as a TOML value" . (kindOf .)) }}
{{- end }}
{{- end }}

{{/*
Config keys the chart sets itself, which a values `config` map must not set:
key -> where the value comes from. values.schema.json lets every config key
through with its type (it is generated from ha_controller.config), so these are
refused here with the reason; tests/unit/test_helm_chart.py checks the lists
against the keys the chart renders and the per-pod and secret keys.
*/}}
{{- define "ha-controller.ownedKeys.broker" -}}
cluster: clusterName
broker_name: the group's name (groups[].name)
broker_id: the pod ordinal (--broker-id)
namesrv_addrs: the nameserver pods (nameserver.replicas)
listen: the container port 10911
ha_listen: the container port 10912
http_listen: the container port 10913 (probes, metrics)
broker_ip1: the pod DNS name (HAC_BROKER_IP1)
store_dir: the store volume (/data/store)
total_replicas: the group's replicas (groups[].replicas)
cluster_secret: clusterSecret (a Secret, as HAC_CLUSTER_SECRET)
admin_token: adminToken (a Secret, as HAC_ADMIN_TOKEN)
tls: the tls values (tls.enabled, tls.existingSecret, tls.requireClientCert)
acl: the acl values (acl.enabled, acl.allowAnonymous, acl.existingSecret)
{{- end }}

{{- define "ha-controller.ownedKeys.nameserver" -}}
listen: the container port 9876
etcd_endpoints: controller.etcdEndpoints or controller.etcd.deploy (as HAC_ETCD_ENDPOINTS)
auto_switch_after_ms: controller.autoSwitchAfterMs (as HAC_AUTO_SWITCH_AFTER_MS)
http_listen: the container port 9877 (probes, metrics)
cluster_secret: clusterSecret (a Secret, as HAC_CLUSTER_SECRET)
admin_token: adminToken (a Secret, as HAC_ADMIN_TOKEN)
tls: the tls values (tls.enabled, tls.existingSecret, tls.requireClientCert)
acl: the acl values (acl.enabled, acl.allowAnonymous, acl.existingSecret)
{{- end }}

{{/* Refuses chart-owned keys in one config map. Context: dict "where" "broker.config" "config" $map "owned" $owned. */}}
{{- define "ha-controller.validateConfig" -}}
{{- $owned := .owned }}
{{- $where := .where }}
{{- range $key, $_ := .config }}
{{- if hasKey $owned $key }}
{{- fail (printf "%s.%s: the chart sets %s from %s; remove it from your values" $where $key $key (get $owned $key)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Checks that values.schema.json cannot express. */}}
{{- define "ha-controller.validate" -}}
{{- $brokerOwned := include "ha-controller.ownedKeys.broker" . | fromYaml }}
{{- $nsOwned := include "ha-controller.ownedKeys.nameserver" . | fromYaml }}
{{- $brokerConfig := .Values.broker.config | default dict }}
{{- include "ha-controller.validateConfig" (dict "where" "nameserver.config" "config" (.Values.nameserver.config | default dict) "owned" $nsOwned) }}
{{- include "ha-controller.validateConfig" (dict "where" "broker.config" "config" $brokerConfig "owned" $brokerOwned) }}
{{- $seen := dict }}
{{- range $i, $group := .Values.groups }}
{{- if hasKey $seen $group.name }}
{{- fail (printf "groups: the name %q appears twice; every broker group needs its own name" $group.name) }}
{{- end }}
{{- $_ := set $seen $group.name true }}
{{- $sts := include "ha-controller.group.fullname" (dict "root" $ "group" $group) }}
{{- if gt (len $sts) 52 }}
{{- fail (printf "groups: StatefulSet name %q is longer than 52 characters; shorten the group name or fullnameOverride" $sts) }}
{{- end }}
{{- $groupConfig := $group.config | default dict }}
{{- include "ha-controller.validateConfig" (dict "where" (printf "groups[%d].config" $i) "config" $groupConfig "owned" $brokerOwned) }}
{{- $replicas := int (default 3 $group.replicas) }}
{{- $isr := min 2 $replicas }}
{{- if hasKey $brokerConfig "in_sync_replicas" }}{{ $isr = int (get $brokerConfig "in_sync_replicas") }}{{ end }}
{{- if hasKey $groupConfig "in_sync_replicas" }}{{ $isr = int (get $groupConfig "in_sync_replicas") }}{{ end }}
{{- if gt $isr $replicas }}
{{- fail (printf "groups[%d] (%s): in_sync_replicas %d exceeds the group's replicas %d; lower in_sync_replicas in the group's config or add replicas" $i $group.name $isr $replicas) }}
{{- end }}
{{- end }}
{{- if and .Values.controller.etcd.deploy .Values.controller.etcdEndpoints }}
{{- fail "controller: set controller.etcdEndpoints (an existing etcd) or controller.etcd.deploy=true (the chart's etcd), not both" }}
{{- end }}
{{- if and (include "ha-controller.etcdEndpoints" .) .Values.controller.preStopSwitch.enabled }}
{{- /* the hook's call may take its timeout plus 5 s; the broker's phased shutdown after it needs 20 s */}}
{{- $need := add (div (add .Values.controller.preStopSwitch.timeoutMs 999) 1000) 25 }}
{{- if lt (int .Values.broker.terminationGracePeriodSeconds) (int $need) }}
{{- fail (printf "broker.terminationGracePeriodSeconds %d leaves no room for the preStop switch (controller.preStopSwitch.timeoutMs %d): give it at least %d, or lower the timeout" (int .Values.broker.terminationGracePeriodSeconds) (int .Values.controller.preStopSwitch.timeoutMs) (int $need)) }}
{{- end }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) }}
{{- fail "tls.enabled needs tls.existingSecret (a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt)" }}
{{- end }}
{{- if and .Values.acl.enabled (not .Values.acl.existingSecret) }}
{{- fail "acl.enabled needs acl.existingSecret (a Secret whose key acl.key holds the users file)" }}
{{- end }}
{{- if and .Values.acl.enabled (not .Values.acl.allowAnonymous) (not .Values.clusterSecret.enabled) }}
{{- fail "acl.allowAnonymous=false needs clusterSecret.enabled: the cluster's own requests are told from clients' by its signature" }}
{{- end }}
{{- /* Open mode is for a one-pod demo: with several nameservers or a group with slaves, a
  pod holding no secret could register as a group's master or detach a slave. */}}
{{- $replicated := gt (int .Values.nameserver.replicas) 1 }}
{{- range .Values.groups }}
{{- if gt (int (default 3 .replicas)) 1 }}{{ $replicated = true }}{{ end }}
{{- end }}
{{- if and $replicated (not .Values.clusterSecret.enabled) }}
{{- fail "clusterSecret.enabled=false needs one nameserver and single-member groups: with more, any pod that reaches the ports could register as a group's master or detach a slave (docs/security.md); keep clusterSecret.enabled=true (a random secret the chart makes, or clusterSecret.existingSecret)" }}
{{- end }}
{{- end }}

{{/*
An HTTP probe on the admin port. Context: dict "root" $ "path" "/readyz" "port" 10913.
With mutual TLS the admin listener wants a client certificate, which the
kubelet cannot present; the probe then runs in the container with the pod's
own certificate (urlopen fails on any status other than 2xx).
*/}}
{{- define "ha-controller.probeHandler" -}}
{{- if and .root.Values.tls.enabled .root.Values.tls.requireClientCert }}
exec:
  command:
    - python
    - -c
    - >-
      import ssl, urllib.request;
      c = ssl.create_default_context(cafile="/etc/ha-controller/tls/ca.crt");
      c.check_hostname = False;
      c.load_cert_chain("/etc/ha-controller/tls/tls.crt", "/etc/ha-controller/tls/tls.key");
      urllib.request.urlopen("https://127.0.0.1:{{ .port }}{{ .path }}", context=c, timeout=3)
{{- else }}
httpGet:
  path: {{ .path }}
  port: http
  scheme: {{ ternary "HTTPS" "HTTP" .root.Values.tls.enabled }}
{{- end }}
{{- end }}

{{/*
nameserver.toml. Keys the chart owns are set here; nameserver.config is merged
over them. Secrets are not in the file: they come from the Secret as
HAC_CLUSTER_SECRET / HAC_ADMIN_TOKEN. Context: $.
*/}}
{{- define "ha-controller.nameserverToml" -}}
{{- $ns := dict }}
{{- $_ := set $ns "listen" "0.0.0.0:9876" }}
{{- $_ := set $ns "http_listen" "0.0.0.0:9877" }}
{{- if .Values.tls.enabled }}
{{- $_ := set $ns "tls" (include "ha-controller.tlsTable" . | fromYaml) }}
{{- end }}
{{- if .Values.acl.enabled }}
{{- $_ := set $ns "acl" (include "ha-controller.aclTable" . | fromYaml) }}
{{- end }}
{{- $ns = mergeOverwrite $ns (deepCopy (.Values.nameserver.config | default dict)) }}
{{- include "ha-controller.toml" $ns }}
{{- end }}

{{/*
broker-<group>.toml. Keys the chart owns are set here; broker.config and then
the group's config are merged over them (the group wins). Per-pod keys are not
in the file: the broker id is the pod ordinal (--broker-id) and the advertised
host the pod DNS name (HAC_BROKER_IP1).
Context: dict "root" $ "group" $group.
*/}}
{{- define "ha-controller.brokerToml" -}}
{{- $root := .root }}
{{- $group := .group }}
{{- $replicas := int (default 3 $group.replicas) }}
{{- $cfg := dict }}
{{- $_ := set $cfg "cluster" $root.Values.clusterName }}
{{- $_ := set $cfg "broker_name" $group.name }}
{{- $_ := set $cfg "namesrv_addrs" (include "ha-controller.namesrvAddrs" $root | splitList ",") }}
{{- $_ := set $cfg "listen" "0.0.0.0:10911" }}
{{- $_ := set $cfg "ha_listen" "0.0.0.0:10912" }}
{{- $_ := set $cfg "http_listen" "0.0.0.0:10913" }}
{{- $_ := set $cfg "store_dir" "/data/store" }}
{{- $_ := set $cfg "total_replicas" $replicas }}
{{- $_ := set $cfg "in_sync_replicas" (min 2 $replicas) }}
{{- if $root.Values.tls.enabled }}
{{- $_ := set $cfg "tls" (include "ha-controller.tlsTable" $root | fromYaml) }}
{{- end }}
{{- if $root.Values.acl.enabled }}
{{- $_ := set $cfg "acl" (include "ha-controller.aclTable" $root | fromYaml) }}
{{- end }}
{{- $cfg = mergeOverwrite $cfg (deepCopy ($root.Values.broker.config | default dict)) (deepCopy ($group.config | default dict)) }}
{{- include "ha-controller.toml" $cfg }}
{{- end }}
