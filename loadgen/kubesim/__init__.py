"""kubesim: a local stand-in for the Kubernetes API server and the kubelet's in-place resize.

Why: the bridge's adaptation to in-place resize (docs/design.md §4) has to be tested end to end
on a machine without a cluster. kubesim serves real HTTP/1.1 on 127.0.0.1 (port 0 by default),
speaks the JSON shapes of the real objects (tests/fixtures/k8s), and writes the cgroup files the
bridge reads into a directory laid out like ``BRIDGE_CGROUP_ROOT`` (v2: ``cpu.max`` etc. in it;
v1: ``cpu/``, ``memory/`` sub-directories).

What it models
  * One Pod (any number of containers), its ResourceClaims and the ResourceSlices, read-only except
    for ``PATCH /api/v1/namespaces/{ns}/pods/{name}/resize`` (strategic merge patch, the default of
    ``kubectl patch --subresource resize``; JSON merge patch too, which replaces the containers list
    and is then rejected like the real API does).
  * API-side validation of a resize (422 ``Invalid`` Status): only cpu/memory requests/limits may
    change (``spec: Forbidden: only cpu and memory resources are mutable``), limits/requests cannot
    be removed, requests <= limits, and the QoS class may not change. Optionally
    (``claims_block_resize``) the ≤1.35 behaviour: a container with ``resources.claims`` cannot be
    resized at all (docs/kubernetes.md, claims vs resize).
  * Each accepted resize bumps ``metadata.generation``; watchers get ``MODIFIED`` events.
  * A kubelet loop (every ``sync_interval``): admits the resize against the node's allocatable
    (``PodResizePending`` ``Infeasible`` beyond allocatable, ``Deferred`` beyond what the other pods
    leave free, with the kubelet's message formats), sets ``allocatedResources`` and
    ``PodResizeInProgress``, then after ``actuation_delay`` writes the cgroup files — memory before
    cpu — and updates ``status.containerStatuses[].resources``. A memory-limit decrease below the
    current usage (``memory.current`` / v1 ``memory.usage_in_bytes`` read from the cgroup directory)
    is held with ``PodResizeInProgress`` reason ``Error`` and retried each sync until usage drops;
    cpu decreases are still applied meanwhile, cpu increases are not (docs/kubernetes.md, cgroup
    values).
  * ``status.observedGeneration`` follows ``metadata.generation`` on each sync.
  * Events: ``POST``/``GET /api/v1/namespaces/{ns}/events``.
  * Discovery (``/version``, ``/api``, ``/apis``, ``/api/v1``, ``/apis/resource.k8s.io/v1``) so that
    ``kubectl --server http://127.0.0.1:PORT get pod`` / ``patch pod … --subresource resize`` work.

What it does not model
  the kubelet's retry timers (Deferred is re-evaluated on every sync, not after 30 s / 3 min),
  authentication/RBAC, other resource kinds, creating/deleting pods, resourceVersion-exact watch
  replay (a watch from an old version gets the current object), ``$patch`` directives, scheduler
  preemption, restarts for ``RestartContainer`` policies, swap, static CPU/memory managers,
  pod-level cgroups (only one container's own cgroup is written: ``container``, default the one
  named ``bridge`` else the first; a container without a limit gets the pod-level limit, as in
  KEP-2837), the old linear cpu.weight formula (the quadratic one of current runtimes is used),
  and real timing (defaults are fast for tests). Authorization headers are recorded, not checked.

Layout (one concern each)
  ``model``    the Pod/claims/slices/events store and the API-side resize validation (sans-I/O);
  ``kubelet``  admission and actuation, and the :class:`Actuator` seam that makes a resize real
               (``start``, ``memory_usage``, ``apply_memory``, ``apply_cpu``; when each is called
               is in that module's docstring). Pass ``KubeSim(actuator=...)`` to replace the
               default, :class:`CgroupActuator` (``cgroup``: writes the files in ``cgroup_dir``);
  ``server``   the HTTP/1.1 front, discovery and watch streams;
  ``sim``      :class:`KubeSim`, which composes them;  ``__main__``  the command line.

Run standalone: ``python -m loadgen.kubesim --pod pod.json --cgroup-dir /tmp/cg`` (prints the URL).
"""

from loadgen.kubesim.cgroup import (
    CgroupActuator,
    CgroupDir,
    milli_to_quota,
    milli_to_shares,
    shares_to_weight,
)
from loadgen.kubesim.kubelet import Actuator, Kubelet
from loadgen.kubesim.model import (
    JSON,
    NodeModel,
    PodStore,
    Want,
    json_merge,
    qos_class,
    status_error,
    strategic_merge,
    validate_resize,
)
from loadgen.kubesim.server import ApiServer
from loadgen.kubesim.sim import KubeSim

__all__ = [
    "JSON",
    "Actuator",
    "ApiServer",
    "CgroupActuator",
    "CgroupDir",
    "KubeSim",
    "Kubelet",
    "NodeModel",
    "PodStore",
    "Want",
    "json_merge",
    "milli_to_quota",
    "milli_to_shares",
    "qos_class",
    "shares_to_weight",
    "status_error",
    "strategic_merge",
    "validate_resize",
]
