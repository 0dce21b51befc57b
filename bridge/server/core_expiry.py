"""The core's expiry role: how sessions end. A connection that ends detaches its session, which
stays resumable until it has been idle ``ttl`` seconds with empty rings; the detached sessions
kept are bounded (the longest-detached idle one makes room for a new session); a closing bridge
forgets them all. Sans-I/O: ``now`` is passed in.
"""

from __future__ import annotations

from bridge.protocol.errors import TooManySessions
from bridge.server.core_state import CoreState
from bridge.server.session import Session


class ExpiryRole(CoreState):
    def detach(self, session: Session, connection: object, now: float) -> None:
        """The connection ended; the session stays resumable until expired."""
        if session.connection is connection:
            session.attached = False
            session.connection = None
            session.detached_at = now

    def expire(self, now: float, ttl: float) -> list[Session]:
        """Forget detached sessions idle for ``ttl`` seconds whose rings are empty."""
        gone = [
            s
            for s in self.sessions.values()
            if not s.attached and now - s.detached_at >= ttl and s.buffered_frames == 0
        ]
        self._forget(gone)
        return gone

    def close(self) -> None:
        """The bridge closed: every session is forgotten, its rings' and state's charges go
        back to the governor (nothing is delivered any more)."""
        self._forget(list(self.sessions.values()))

    def _make_room_for_a_session(self) -> None:
        """Detached sessions are kept for resume, but never more than ``max_sessions`` of them:
        forget the longest-detached one that holds no frames, or refuse the new session."""
        detached = [s for s in self.sessions.values() if not s.attached]
        if len(detached) < self.config.max_sessions:
            return
        idle = [s for s in detached if s.buffered_frames == 0]
        if not idle:
            raise TooManySessions(
                f"{len(detached)} detached sessions still hold undelivered frames"
            )
        self._forget([min(idle, key=lambda s: s.detached_at)])

    def _forget(self, sessions: list[Session]) -> None:
        for session in sessions:
            del self.sessions[session.session_id]
            if self.by_device.get(session.device_id) is session:
                del self.by_device[session.device_id]
                if self.on_forget is not None:  # the pod's table forgets it here
                    self.on_forget(session.device_id)
            for stream in session.streams.values():
                self.streams.pop(stream.key, None)
                stream.ring.release_all()
            charge = self._state_charges.pop(session.session_id, None)
            if charge is not None:
                charge.release()
        if sessions:
            self._rebalance_rings()
