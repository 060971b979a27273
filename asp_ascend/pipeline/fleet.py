"""The rollout fleet's health: failures, hung instances, restarts and rejoining.

An instance whose actor dies (or that makes no progress for ``rollout.request_timeout_s``,
pipeline/watchdog.py) is marked failed in the plan's Feeder: its unfinished prompts go back
to the dispatcher and the survivors generate them; its groups waiting in the sample queue are
dropped. With ``rollout.max_restarts`` left, Ray restarts the actor (fresh engine, initial
weights); the fleet probes it, sends it the newest published weights, and only then lets it
rejoin the dispatcher (``instance`` event ``up``). Under the broadcast transport a restarted
instance that cannot be sent one object-store copy waits for the next broadcast; the trainer's
``publish`` of that copy goes to ``publish_sent``, so the loop bounds it as any publish
(pipeline/trainer_waits.py).

The fleet reports what the loop must do (instances that went down or came back); it never
reaches into the loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..scheduler.execution import Feeder
from .contracts import RolloutInstance, WeightTransport
from .watchdog import HangWatch

REJOIN_TIMEOUT_S = 1800.0  # how long a failed instance with restarts left is waited for


@dataclass
class FleetOptions:
    poll_s: float = 0.05              # long-poll of each instance, and the loop's longest wait
    request_timeout_s: float = 0.0    # rollout.request_timeout_s: 0 = no hang detection
    max_restarts: int = 0             # rollout.max_restarts


class Fleet:
    def __init__(self, instances: list[RolloutInstance], feeder: Feeder, wsync: WeightTransport,
                 options: FleetOptions, *, ticket: Any, event: Callable[..., None], say: Callable[[str], None],
                 now: Callable[[], float], publish_sent: Callable[[int, Any, int], None] | None = None):
        self.instances = instances
        self.feeder = feeder
        self.wsync = wsync
        self.opts = options
        self.event, self.say, self.now = event, say, now
        self.publish_sent = publish_sent   # (version, publish ref, instance): a catch-up copy was sent
        self.watch = HangWatch(len(instances), options.request_timeout_s)  # hung instances count as failed
        self.restarts_left = [options.max_restarts] * len(instances)
        self.last_ticket = (feeder.adm.published, ticket)  # (version, WeightTicket ref) last published
        self.rejoining: dict[int, dict] = {}

    def live(self) -> list[int]:
        return [r for r in range(len(self.instances)) if self.feeder.alive(r)]

    def failed(self, r: int, exc: BaseException) -> int | None:
        """Mark ``r`` down; returns how many admitted groups will never arrive from it (their
        sample-queue reservations), or None if it was already down."""
        if not self.feeder.alive(r):
            return None
        moved, lost = self.feeder.failed(r)
        self.event("instance", t=self.now(), instance=r, state="down", reason=f"{type(exc).__name__}: {exc}"[:300])
        self.say(f"rollout instance {r} failed ({type(exc).__name__}); {len(moved)} prompt(s) re-dispatched")
        self.watch.forget(r)
        if self.restarts_left[r] > 0 and self.last_ticket[1] is not None:  # Ray restarts it: wait for it
            self.restarts_left[r] -= 1
            self.rejoining[r] = {"ref": None, "version": None, "retry_at": self.now() + 1.0,
                                 "give_up_at": self.now() + REJOIN_TIMEOUT_S}
        return lost

    def hung(self, ray) -> list[tuple[int, BaseException]]:
        """Instances with work and no progress for ``rollout.request_timeout_s``, killed; the
        loop handles each as failed."""
        busy = [self.feeder.alive(r) and self.feeder.inflight[r] > 0 for r in range(len(self.instances))]
        out = []
        for r in self.watch.hung(self.now(), busy):
            self.kill(ray, r, f"no progress for {self.watch.timeout_s:g} s with {self.feeder.inflight[r]} group(s) "
                              "in flight")
            out.append((r, TimeoutError(f"no progress for {self.watch.timeout_s:g} s")))
        return out

    def kill(self, ray, r: int, why: str) -> None:
        """Kill hung instance ``r`` (``why``), so that its pending calls end; Ray restarts it while
        ``rollout.max_restarts`` allows. The loop then handles it as failed (:meth:`failed`)."""
        self.say(f"rollout instance {r}: {why}; treating it as failed")
        try:
            ray.kill(self.instances[r], no_restart=self.restarts_left[r] <= 0)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def published(self, version: int, ticket: Any) -> None:
        self.last_ticket = (version, ticket)

    def joining_next_sync(self) -> list[int]:
        return [r for r, st in self.rejoining.items() if st.get("await_sync")]

    def joins(self, r: int, ref: Any, version: int) -> None:
        """``r`` receives ``version`` in the broadcast that has just started."""
        self.rejoining[r].update(ref=ref, version=version, await_sync=False)

    def rejoin(self, ray, trainer_holds_published: Callable[[], bool]) -> list[tuple[int, int]]:
        """Advance every restarting instance; returns (instance, version) of those that rejoined."""
        back = []
        for r, st in list(self.rejoining.items()):
            if st.get("await_sync"):  # joins the next broadcast
                continue
            if st["ref"] is None:  # probe again: calls to a restarting actor fail at once
                if self.now() >= st["give_up_at"]:
                    del self.rejoining[r]
                elif self.now() >= st["retry_at"]:
                    st["ref"] = self.instances[r].ready.remote()
                continue
            if not ray.wait([st["ref"]], timeout=0)[0]:
                continue
            try:
                ray.get(st["ref"])
            except ray.exceptions.RayError:  # still restarting (or gone): probe again later
                st.update(ref=None, version=None, retry_at=self.now() + 2.0)
                continue
            if st["version"] is not None:
                self.feeder.synced(r, st["version"])
            if self._send_newest(r, st, trainer_holds_published):
                continue
            del self.rejoining[r]
            self.feeder.restarted(r)
            self.event("instance", t=self.now(), instance=r, state="up", version=st["version"])
            self.say(f"rollout instance {r} restarted; rejoined at version {st['version']}")
            back.append((r, st["version"]))
        return back

    def _send_newest(self, r: int, st: dict, trainer_holds_published: Callable[[], bool]) -> bool:
        """True if ``r`` must first receive (newer) weights."""
        published = self.feeder.adm.published
        if st["version"] is not None and st["version"] >= published:
            return False
        if not self.wsync.broadcast:
            st["version"], ticket = self.last_ticket
            st["ref"] = self.instances[r].update_weights.remote(ticket)
        elif trainer_holds_published():  # one object-store copy for this instance alone
            st["version"], ticket = published, self.wsync.catch_up_ticket(published)
            if self.publish_sent is not None:
                self.publish_sent(published, ticket, r)
            st["ref"] = self.instances[r].update_weights.remote(ticket)
        else:
            st.update(ref=None, await_sync=True)
        return True

    def check_not_stranded(self, syncs_in_flight: bool) -> None:
        """Broadcast + restarts: a restarted instance that could not be caught up at once waits
        for the next broadcast; if no instance is alive to produce it, the run cannot go on."""
        if self.live() or not self.rejoining or syncs_in_flight:
            return
        if all(st.get("await_sync") for st in self.rejoining.values()):
            raise RuntimeError("every rollout instance failed in the middle of an iteration and the broadcast weight "
                               "sync cannot catch the restarted ones up; resume from the last checkpoint with "
                               "resume=true, or set weight_sync.transport=object_store")
