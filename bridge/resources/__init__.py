"""Resource awareness and live adaptation (docs/design.md §4).

Sans-I/O core: :mod:`.quantity`, :mod:`.cgroup_parse`, :mod:`.pod` (Pod/ResourceClaim/ResourceSlice
models), :mod:`.plan` (``make_plan``). Adapters: :mod:`.cgroup` (files → reading), :mod:`.poller`
(asyncio polling), :mod:`.kubeapi` (own Pod watch, claims, slices, Events), :mod:`.gpu` (NVML).
:mod:`.adapt` owns the watchers and applies each plan to an ``AdaptTarget``; :mod:`.cli` is
``simbridge resources``.
"""
