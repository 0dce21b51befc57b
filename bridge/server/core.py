"""The bridge's sans-I/O heart: sessions, rings and the egress log, driven by method calls.

No sockets, clocks, threads or files in here: adapters pass in messages, sizes and timestamps,
and learn about state changes through a :class:`~bridge.server.ports.Listener`. That keeps every
rule (admission, duplicates, gaps, cumulative acks, watermarks, ring budgets) unit-testable
without an event loop.

``BridgeCore`` is its roles over one shared state (``core_state.CoreState``), one file each:

* ``core_ingest``: Hello, offers, the edge's acks (the ``IngestCore`` port);
* ``core_work``: the next frame to process and its result (the ``Work`` port);
* ``core_delivery``: the sink's batches, acks and watermarks (the ``Delivery`` port);
* ``core_budget``: the memory budget, ring shares, reclaim (the ``Budget`` port);
* ``core_expiry``: detach, TTL expiry, room for a new session, close.

Adapters name the ports (``bridge.server.ports``), never this class; only ``app`` builds it.
"""

from __future__ import annotations

from bridge.server.core_budget import BudgetRole
from bridge.server.core_delivery import DeliveryRole
from bridge.server.core_expiry import ExpiryRole
from bridge.server.core_ingest import IngestRole
from bridge.server.core_work import WorkRole


class BridgeCore(IngestRole, WorkRole, DeliveryRole, BudgetRole, ExpiryRole):
    """Built with ``BridgeCore(config, listener, governor)`` (see ``CoreState``)."""
