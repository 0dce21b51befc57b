#!/usr/bin/env bash
# simbridge on kind: create a cluster, build and load the image, install the chart, stream load at
# the bridge, resize its pod in place mid-run, and check that the container saw the new CPU limit
# without a restart. Results land in $OUT_DIR (default deploy/kind/out/<timestamp>/).
#
# Usage: deploy/kind/demo.sh [1.35|1.36|1.37]        (default 1.36)
#
# Environment (all optional):
#   CLUSTER=simbridge-136       kind cluster name (reused if it exists)
#   KIND_NODE_IMAGE=...         override the node image of cluster-<version>.yaml
#   NS=simbridge RELEASE=demo   namespace and Helm release
#   IMAGE=simbridge:dev         image to build and load; IMAGE_TARGET=cpu|gpu (Dockerfile target)
#   SKIP_BUILD=1                reuse an IMAGE that is already built
#   WITH_DRA=1                  install the DRA example driver (simulated GPUs) and give the bridge one
#   DRA_MODE=extendedResource   or claimTemplate (to observe whether resize is rejected, docs/kubernetes.md)
#   DRA_EXAMPLE_DRIVER_REF=main git ref of kubernetes-sigs/dra-example-driver to install from
#   POD_LEVEL=1                 use pod-level resources and resize spec.resources (1.36+; refused for
#                               a cluster config without the InPlacePodLevelResourcesVerticalScaling gate)
#   CPU_TO=1500m                CPU limit after the resize (the chart starts at 500m, values-demo.yaml)
#   DURATION=60 RESIZE_AT=20    load duration and when (seconds into the run) to resize
#   RESIZE_AS_RESIZER=1         send the resize as the chart's resizer ServiceAccount (kubectl --as)
#   DELETE_CLUSTER=1            delete the kind cluster at the end
#   WS_TARGET=ws://... GRPC_TARGET=grpc://...   where the load generator sends (default: the pod's DNS name)
#
# Needs: docker, kind, kubectl (>= 1.32 for --subresource resize), helm (>= 3.14), git (WITH_DRA).
# Not run on the project's CI (no container engine or cluster there); see deploy/kind/README.md.
# Bash 3.2 safe: a possibly empty array is expanded as ${a[@]+"${a[@]}"} (set -u aborts on it < 4.4).
set -euo pipefail

K8S_MINOR="${1:-${K8S_MINOR:-1.36}}"
case "${K8S_MINOR}" in
  1.35 | 1.36 | 1.37) ;;
  *)
    echo "usage: $0 [1.35|1.36|1.37]" >&2
    exit 2
    ;;
esac

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "${HERE}/../.." && pwd)"
if [[ "${POD_LEVEL:-0}" == 1 ]] &&
  ! grep -Eq '^ *InPlacePodLevelResourcesVerticalScaling: *true' "${HERE}/cluster-${K8S_MINOR}.yaml"; then
  echo "POD_LEVEL=1 needs in-place pod-level resize (gate InPlacePodLevelResourcesVerticalScaling)," \
    "which cluster-${K8S_MINOR}.yaml does not enable; use 1.36 or 1.37" >&2
  exit 2
fi
CLUSTER="${CLUSTER:-simbridge-${K8S_MINOR//./}}"
KIND_NODE_IMAGE="${KIND_NODE_IMAGE:-}"
NS="${NS:-simbridge}"
RELEASE="${RELEASE:-demo}"
IMAGE="${IMAGE:-simbridge:dev}"
IMAGE_TARGET="${IMAGE_TARGET:-cpu}"
SKIP_BUILD="${SKIP_BUILD:-0}"
WITH_DRA="${WITH_DRA:-0}"
DRA_MODE="${DRA_MODE:-extendedResource}"
DRA_EXAMPLE_DRIVER_REF="${DRA_EXAMPLE_DRIVER_REF:-main}"
POD_LEVEL="${POD_LEVEL:-0}"
CPU_TO="${CPU_TO:-1500m}"
DURATION="${DURATION:-60}"
RESIZE_AT="${RESIZE_AT:-20}"
RESIZE_AS_RESIZER="${RESIZE_AS_RESIZER:-0}"
DELETE_CLUSTER="${DELETE_CLUSTER:-0}"
OUT_DIR="${OUT_DIR:-${HERE}/out/$(date -u +%Y%m%dT%H%M%SZ)}"

FULLNAME="${RELEASE}-simbridge"
POD="${FULLNAME}-0"
HEADLESS="${FULLNAME}-headless"
POD_DNS="${POD}.${HEADLESS}.${NS}.svc.cluster.local"
WS_TARGET="${WS_TARGET:-ws://${POD_DNS}:8080/v1/ingest}"
GRPC_TARGET="${GRPC_TARGET:-grpc://${POD_DNS}:9090}"
SINK_PORT=7000
LOADGEN_POD=loadgen
REPORT_IN_POD=/tmp/report.json

log() { printf '\n==> %s\n' "$*" >&2; }
die() {
  printf 'demo: %s\n' "$*" >&2
  exit 1
}
need() { command -v "$1" >/dev/null 2>&1 || die "'$1' is required but not on PATH"; }

# =====================================================================================================
# LOADGEN INTERFACE: the only place that knows simbridge-loadgen's command line (loadgen/ in this repo;
# another engineer owns it). If its flags change, change them here and nowhere else.
#
# sink_args: container args of the reference VisualizationSink the bridge pushes to.
sink_args() {
  printf '["simbridge-loadgen", "sink", "--listen", "0.0.0.0:%s"]' "${SINK_PORT}"
}
# loadgen_run: stream frames at the running bridge over WebSocket and gRPC (edges alternate) for
# DURATION seconds, no resizes of its own (this script resizes), and write a JSON report inside the
# loadgen pod. Exit 1 if any frame was not acknowledged as delivered.
loadgen_run() {
  kubectl -n "${NS}" exec "${LOADGEN_POD}" -- \
    simbridge-loadgen run --builtin steady --quiet \
    --target "${WS_TARGET}" \
    --target "${GRPC_TARGET}" \
    --duration "${DURATION}" \
    --report "${REPORT_IN_POD}"
}
# =====================================================================================================

LOADGEN_PID=""
cleanup() {
  if [[ -n "${LOADGEN_PID}" ]] && kill -0 "${LOADGEN_PID}" 2>/dev/null; then
    kill "${LOADGEN_PID}" 2>/dev/null || true
  fi
  if [[ "${DELETE_CLUSTER}" == 1 ]]; then
    kind delete cluster --name "${CLUSTER}" || true
  fi
}
trap cleanup EXIT

# Extra `helm --set` arguments, collected as the scenario is assembled.
HELM_SET=()

create_cluster() {
  if kind get clusters 2>/dev/null | grep -qx "${CLUSTER}"; then
    log "reusing kind cluster ${CLUSTER}"
  else
    log "creating kind cluster ${CLUSTER} (Kubernetes ${K8S_MINOR})"
    local args=(create cluster --name "${CLUSTER}" --config "${HERE}/cluster-${K8S_MINOR}.yaml" --wait 180s)
    if [[ -n "${KIND_NODE_IMAGE}" ]]; then
      args+=(--image "${KIND_NODE_IMAGE}")
    fi
    kind "${args[@]}"
  fi
  kubectl config use-context "kind-${CLUSTER}" >/dev/null
  kubectl version | tee "${OUT_DIR}/kubectl-version.txt"
}

build_image() {
  if [[ "${SKIP_BUILD}" == 1 ]]; then
    log "SKIP_BUILD=1: using existing ${IMAGE}"
  else
    log "building ${IMAGE} (Dockerfile target ${IMAGE_TARGET})"
    docker build --target "${IMAGE_TARGET}" -t "${IMAGE}" "${REPO}"
  fi
  kind load docker-image "${IMAGE}" --name "${CLUSTER}"
}

install_dra_driver() {
  [[ "${WITH_DRA}" == 1 ]] || return 0
  need git
  log "installing the DRA example driver (simulated GPUs, driver gpu.example.com) at ${DRA_EXAMPLE_DRIVER_REF}"
  local src
  src="$(mktemp -d)"
  git clone --depth 1 --branch "${DRA_EXAMPLE_DRIVER_REF}" \
    https://github.com/kubernetes-sigs/dra-example-driver.git "${src}/dra-example-driver"
  helm upgrade --install dra-example-driver "${src}/dra-example-driver/deployments/helm/dra-example-driver" \
    --namespace dra-example-driver --create-namespace --wait --timeout 5m
  log "waiting for ResourceSlices"
  local i
  for i in $(seq 1 60); do
    if [[ -n "$(kubectl get resourceslices -o name 2>/dev/null)" ]]; then
      break
    fi
    sleep 2
  done
  kubectl get resourceslices -o wide | tee "${OUT_DIR}/resourceslices.txt"
  case "${DRA_MODE}" in
    extendedResource)
      # The example driver's DeviceClass has no extendedResourceName: the chart creates one that does.
      HELM_SET+=(
        --set dra.enabled=true --set dra.mode=extendedResource
        --set dra.extendedResource.name=example.com/gpu
        --set dra.extendedResource.deviceClass.create=true
        --set dra.extendedResource.deviceClass.name=simbridge-gpu.example.com
        --set-string "dra.extendedResource.deviceClass.selectors[0]=device.driver == 'gpu.example.com'"
        --set rbac.resourceSlices=true
      )
      ;;
    claimTemplate)
      HELM_SET+=(
        --set dra.enabled=true --set dra.mode=claimTemplate
        --set dra.claimTemplate.deviceClassName=gpu.example.com
        --set dra.claimTemplate.selectors=null
        --set rbac.resourceSlices=true
      )
      ;;
    *) die "DRA_MODE must be extendedResource or claimTemplate" ;;
  esac
}

deploy_sink() {
  log "deploying the reference visualization sink"
  kubectl -n "${NS}" apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: viz-sink
  labels: {app: viz-sink}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 10001, seccompProfile: {type: RuntimeDefault}}
  containers:
    - name: sink
      image: ${IMAGE}
      imagePullPolicy: Never
      command: $(sink_args)
      ports: [{name: grpc, containerPort: ${SINK_PORT}}]
      securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
---
apiVersion: v1
kind: Service
metadata:
  name: viz-sink
spec:
  selector: {app: viz-sink}
  ports: [{name: grpc, port: ${SINK_PORT}, targetPort: grpc}]
EOF
  kubectl -n "${NS}" wait --for=condition=Ready pod/viz-sink --timeout=120s
}

install_chart() {
  log "installing the chart (release ${RELEASE} in ${NS})"
  local repo="${IMAGE%:*}" tag="${IMAGE##*:}"
  if [[ "${POD_LEVEL}" == 1 ]]; then
    HELM_SET+=(
      --set podResources.enabled=true
      --set podResources.requests.cpu=500m --set podResources.requests.memory=1Gi
      --set podResources.limits.cpu=500m --set podResources.limits.memory=1Gi
    )
  fi
  helm upgrade --install "${RELEASE}" "${REPO}/charts/simbridge" \
    --namespace "${NS}" --create-namespace \
    -f "${HERE}/values-demo.yaml" \
    --set image.repository="${repo}" --set image.tag="${tag}" \
    --set bridge.sinkAddress="viz-sink.${NS}.svc.cluster.local:${SINK_PORT}" \
    ${HELM_SET[@]+"${HELM_SET[@]}"} \
    --wait --timeout 5m
  kubectl -n "${NS}" get pod "${POD}" -o yaml >"${OUT_DIR}/pod-before.yaml"
}

start_loadgen_pod() {
  log "starting the loadgen pod"
  kubectl -n "${NS}" apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: ${LOADGEN_POD}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 10001, seccompProfile: {type: RuntimeDefault}}
  containers:
    - name: loadgen
      image: ${IMAGE}
      imagePullPolicy: Never
      command: ["sleep", "infinity"]
      securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
EOF
  kubectl -n "${NS}" wait --for=condition=Ready "pod/${LOADGEN_POD}" --timeout=120s
}

pod_jsonpath() {
  kubectl -n "${NS}" get pod "${POD}" -o "jsonpath=$1"
}

show_rbac() {
  local sa="system:serviceaccount:${NS}:${FULLNAME}-resizer"
  log "RBAC of the resizer identity (${sa})"
  {
    printf 'patch pods/resize %s: ' "${POD}"
    kubectl auth can-i patch "pods/${POD}" --subresource=resize -n "${NS}" --as="${sa}" || true
    printf 'patch pods (spec) %s: ' "${POD}"
    kubectl auth can-i patch "pods/${POD}" -n "${NS}" --as="${sa}" || true
    printf 'get pods: '
    kubectl auth can-i get pods -n "${NS}" --as="${sa}" || true
  } | tee "${OUT_DIR}/rbac-resizer.txt"
}

resize() {
  local patch
  if [[ "${POD_LEVEL}" == 1 ]]; then
    patch="{\"spec\":{\"resources\":{\"requests\":{\"cpu\":\"${CPU_TO}\"},\"limits\":{\"cpu\":\"${CPU_TO}\"}}}}"
  else
    # Guaranteed QoS must stay Guaranteed: change requests and limits together.
    patch="{\"spec\":{\"containers\":[{\"name\":\"bridge\",\"resources\":{\"requests\":{\"cpu\":\"${CPU_TO}\"},\"limits\":{\"cpu\":\"${CPU_TO}\"}}}]}}"
  fi
  local as=()
  if [[ "${RESIZE_AS_RESIZER}" == 1 ]]; then
    as=(--as "system:serviceaccount:${NS}:${FULLNAME}-resizer")
  fi
  log "resizing ${POD} in place: cpu -> ${CPU_TO}"
  printf '%s\n' "${patch}" >"${OUT_DIR}/resize-patch.json"
  if ! kubectl -n "${NS}" patch pod "${POD}" ${as[@]+"${as[@]}"} --subresource resize --type strategic -p "${patch}" \
    >"${OUT_DIR}/resize-response.txt" 2>&1; then
    cat "${OUT_DIR}/resize-response.txt" >&2
    echo "RESIZE REJECTED" >>"${OUT_DIR}/summary.txt"
    return 1
  fi
}

wait_resized() {
  log "waiting for the kubelet to actuate the resize"
  local i conditions actual
  for i in $(seq 1 60); do
    conditions="$(pod_jsonpath '{range .status.conditions[*]}{.type}={.reason} {end}')"
    if [[ "${POD_LEVEL}" == 1 ]]; then
      actual="$(pod_jsonpath '{.status.resources.limits.cpu}')"
    else
      actual="$(pod_jsonpath '{.status.containerStatuses[?(@.name=="bridge")].resources.limits.cpu}')"
    fi
    if [[ "${conditions}" != *PodResizePending* && "${conditions}" != *PodResizeInProgress* && "${actual}" == "${CPU_TO}" ]]; then
      log "resize done after ~${i}s (actual cpu limit ${actual})"
      return 0
    fi
    sleep 1
  done
  echo "resize not finished after 60s; conditions: ${conditions}; actual cpu limit: ${actual}" >&2
  return 1
}

expected_cpu_max() {
  # cpu.max "<quota> <period>" for a CPU quantity in millicores ("1500m") or cores ("2").
  local q="$1" milli
  if [[ "${q}" == *m ]]; then milli="${q%m}"; else milli=$((q * 1000)); fi
  printf '%s 100000\n' "$((milli * 100))"
}

check_container() {
  log "checking the container"
  local cpu_max want restarts
  cpu_max="$(kubectl -n "${NS}" exec "${POD}" -c bridge -- cat /sys/fs/cgroup/cpu.max)"
  want="$(expected_cpu_max "${CPU_TO}")"
  restarts="$(pod_jsonpath '{.status.containerStatuses[?(@.name=="bridge")].restartCount}')"
  kubectl -n "${NS}" exec "${POD}" -c bridge -- cat /sys/fs/cgroup/memory.max >"${OUT_DIR}/memory.max" || true
  kubectl -n "${NS}" exec "${POD}" -c bridge -- python -c \
    "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9100/debug/resources').read().decode())" \
    >"${OUT_DIR}/debug-resources.txt" || true
  {
    echo "cpu.max: ${cpu_max} (expected ${want}; runc with systemd may round the quota up to 10ms granularity)"
    echo "restartCount: ${restarts} (expected 0)"
  } | tee -a "${OUT_DIR}/summary.txt"
  local ok=0
  [[ "${cpu_max}" == "${want}" ]] || [[ "${cpu_max% *}" -ge "${want% *}" && "${cpu_max% *}" -le "$((${want% *} + 1000))" ]] || ok=1
  [[ "${restarts}" == 0 ]] || ok=1
  return "${ok}"
}

collect() {
  log "collecting results in ${OUT_DIR}"
  kubectl -n "${NS}" get pod "${POD}" -o yaml >"${OUT_DIR}/pod-after.yaml"
  kubectl -n "${NS}" get events --field-selector "involvedObject.name=${POD}" -o wide >"${OUT_DIR}/events.txt" || true
  kubectl -n "${NS}" logs "${POD}" -c bridge --tail=2000 >"${OUT_DIR}/bridge.log" || true
  kubectl -n "${NS}" cp "${LOADGEN_POD}:${REPORT_IN_POD}" "${OUT_DIR}/report.json" ||
    echo "no loadgen report" >>"${OUT_DIR}/summary.txt"
}

main() {
  need docker
  need kind
  need kubectl
  need helm
  mkdir -p "${OUT_DIR}"
  echo "simbridge kind demo, Kubernetes ${K8S_MINOR}, $(date -u +%FT%TZ)" >"${OUT_DIR}/summary.txt"
  create_cluster
  build_image
  kubectl create namespace "${NS}" --dry-run=client -o yaml | kubectl apply -f -
  install_dra_driver
  deploy_sink
  install_chart
  start_loadgen_pod
  show_rbac

  log "running the load generator for ${DURATION}s; resizing at ${RESIZE_AT}s"
  loadgen_run >"${OUT_DIR}/loadgen.out" 2>&1 &
  LOADGEN_PID=$!
  sleep "${RESIZE_AT}"
  local status=0
  if resize; then
    wait_resized || status=1
    check_container || status=1
  else
    status=1
  fi
  log "waiting for the load generator to finish"
  wait "${LOADGEN_PID}" || {
    echo "loadgen exited non-zero (see loadgen.out)" >>"${OUT_DIR}/summary.txt"
    status=1
  }
  LOADGEN_PID=""
  collect
  log "summary"
  cat "${OUT_DIR}/summary.txt"
  return "${status}"
}

main "$@"
