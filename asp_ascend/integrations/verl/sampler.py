"""``AspSampler``: verl's ``train_sampler`` yielding dataset indices in the ASP schedule's order.

verl's trainers build ``StatefulDataLoader(dataset, batch_size=B, drop_last=True,
sampler=train_sampler)`` (``RayPPOTrainer._create_dataloader``), so every consecutive run of
``B`` indices this sampler yields is one verl batch. The sampler yields, epoch by epoch, the
schedule's full iterations in order, each laid out by :mod:`.layout`: one verl batch = one
ASP iteration, same membership, mini-batches in update order. A partial last iteration (the
remainder of an epoch) is left out, as verl's ``drop_last`` would drop it.

Resume: the sampler is ``Stateful`` (``state_dict``/``load_state_dict``), so torchdata's
``StatefulDataLoader`` saves ``{epoch, yielded}`` inside verl's ``data.pt`` and restores the
exact position. verl skips restoring ``data.pt`` at an epoch boundary; :meth:`resume_at`
(called by the trainer adapter after verl's ``_load_checkpoint``) then sets the epoch from
``global_steps``. ``iter()`` after an epoch was walked to its end starts the next epoch (verl calls it
once per epoch).

Epochs missing from the schedule are planned on demand by ``plan_epoch(epoch)`` (the
``scheduler.adaptive`` re-plan from observed lengths); the plan of an epoch, once made, is
kept (and persisted by the planner), so a resumed run replays the same order.
No torch: torchdata recognises the protocol by its methods.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Optional

from ...errors import DataError
from .layout import iteration_order

SCHEDULE_COLUMNS = ("epoch", "prompt_id", "iteration", "mini_batch", "instance", "dispatch_rank")


class AspSampler:
    """Indices of ``dataset`` in schedule order; see the module doc.

    ``schedule``: a DESIGN 6 schedule frame (any epochs planned so far).
    ``iteration_size``: prompts per ASP iteration (verl ``data.train_batch_size``; the fully
    async feed: prompts per parameter version). ``num_samples``: dataset length.
    ``index_of``: schedule ``prompt_id`` -> dataset position (default: the id is the position).
    ``layout``: ``mini_batch`` or ``dispatch`` (:func:`.layout.iteration_order`).
    ``trainer_dp``: the actor's data-parallel size (may be set later, before the first epoch,
    through :meth:`set_trainer_dp`).
    """

    def __init__(self, schedule, iteration_size: int, num_samples: int, *,
                 index_of: Optional[Mapping[str, int]] = None, layout: str = "mini_batch", trainer_dp: int = 1,
                 plan_epoch: Optional[Callable[[int], Any]] = None):
        if iteration_size < 1:
            raise DataError(f"iteration_size must be >= 1, got {iteration_size}")
        self.iteration_size = int(iteration_size)
        self.num_samples = int(num_samples)
        self.index_of = index_of
        self.layout = layout
        self.trainer_dp = int(trainer_dp)
        self.plan_epoch = plan_epoch
        self._plans: dict[int, Any] = {}
        self._orders: dict[int, list[int]] = {}
        for e, frame in _split_epochs(schedule).items():
            self._plans[e] = frame
        if not self._plans and plan_epoch is None:
            raise DataError("the schedule is empty and no planner was given; run `asp schedule` first")
        first = min(self._plans) if self._plans else 0
        self._length = len(self.order(first))
        if self._length == 0:
            raise DataError(f"epoch {first} of the schedule has no full iteration of {iteration_size} prompts; "
                            f"the dataset is smaller than data.train_batch_size")
        # position: the epoch the running iterator walks and how many indices it has yielded
        self.epoch, self.yielded = first, 0
        self._next_epoch = first
        self._pending: Optional[tuple[int, int]] = None
        self._started: set[int] = set()  # epochs an iterator has walked (their order is fixed)

    # ---------------------------------------------------------------- plans
    def set_trainer_dp(self, dp: int) -> None:
        """The actor's data-parallel size (known once verl's workers exist). Orders already
        made for a running epoch keep their layout; later epochs use ``dp``."""
        if dp != self.trainer_dp:
            self.trainer_dp = int(dp)
            self._orders = {e: o for e, o in self._orders.items() if e in self._started}

    def plan(self, epoch: int):
        """The schedule rows of ``epoch`` (planned on demand)."""
        if epoch not in self._plans:
            if self.plan_epoch is None:
                raise DataError(f"the schedule has epochs {sorted(self._plans)} but verl asks for epoch {epoch}; "
                                f"plan as many epochs as trainer.total_epochs (asp schedule with train.epochs="
                                f"{epoch + 1}) or turn on asp.scheduler.adaptive")
            frame = self.plan_epoch(epoch)
            self._plans[epoch] = _split_epochs(frame).get(epoch, frame)
        return self._plans[epoch]

    def order(self, epoch: int) -> list[int]:
        """Dataset indices of ``epoch``'s full iterations, in yield order."""
        if epoch in self._orders:
            return self._orders[epoch]
        frame = self.plan(epoch)
        out: list[int] = []
        for (_it,), rows in _iterations(frame):
            if len(rows) != self.iteration_size:
                if len(rows) > self.iteration_size:
                    raise DataError(f"schedule epoch {epoch} iteration {_it} has {len(rows)} prompts but "
                                    f"data.train_batch_size is {self.iteration_size}; re-run `asp schedule` with "
                                    f"train.global_batch_size={self.iteration_size}")
                continue  # the partial last iteration: verl's drop_last drops it too
            out.extend(self._index(pid) for pid in iteration_order(rows, self.layout, self.trainer_dp))
        if hasattr(self, "_length") and len(out) != self._length:
            raise DataError(f"schedule epoch {epoch} has {len(out) // self.iteration_size} full iterations, the "
                            f"first epoch {self._length // self.iteration_size}; every epoch must schedule the "
                            f"same dataset")
        self._orders[epoch] = out
        return out

    def _index(self, prompt_id) -> int:
        if self.index_of is not None:
            try:
                idx = self.index_of[str(prompt_id)]
            except KeyError:
                raise DataError(f"schedule prompt_id {prompt_id!r} is not in the dataset; the schedule was made "
                                f"for another dataset") from None
        else:
            try:
                idx = int(prompt_id)
            except (TypeError, ValueError):
                raise DataError(f"schedule prompt_id {prompt_id!r} is not a dataset position; schedule verl data "
                                f"with row-index ids (data.id_key absent) or pass index_of") from None
        if not 0 <= idx < self.num_samples:
            raise DataError(f"schedule prompt_id {prompt_id!r} -> row {idx}, outside the dataset (0..{self.num_samples - 1})")
        return idx

    # ---------------------------------------------------------------- sampler protocol
    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[int]:
        if self._pending is not None:
            epoch, start = self._pending
            self._pending = None
        else:
            epoch, start = self._next_epoch, 0
        self.epoch, self.yielded = epoch, start
        return _Cursor(self, epoch, start)

    # ---------------------------------------------------------------- state (torchdata Stateful)
    def state_dict(self) -> dict:
        return {"epoch": int(self.epoch), "yielded": int(self.yielded)}

    def load_state_dict(self, state: dict) -> None:
        try:
            epoch, yielded = int(state["epoch"]), int(state["yielded"])
        except (KeyError, TypeError, ValueError):
            raise DataError(f"dataloader state {state!r} was not written by the ASP sampler (no epoch/yielded); "
                            f"resume a run with the sampler it started with") from None
        if not 0 <= yielded <= self._length:
            raise DataError(f"dataloader state: {yielded} indices yielded, but an epoch has {self._length}")
        self._pending = (epoch, yielded)
        self.epoch, self.yielded = epoch, yielded
        self._next_epoch = epoch

    def resume_at(self, global_steps: int, steps_per_epoch: int) -> None:
        """Align with verl after its ``_load_checkpoint``: the next ``iter()`` is the epoch verl's
        loop starts (``global_steps // steps_per_epoch``); a position restored from ``data.pt``
        (non-boundary) must agree with it."""
        if steps_per_epoch <= 0 or global_steps <= 0:
            return
        epoch = global_steps // steps_per_epoch
        if self._pending is not None:
            want = (epoch, (global_steps % steps_per_epoch) * self.iteration_size)
            if self._pending != want:
                raise DataError(f"resume: the dataloader state says epoch {self._pending[0]} after "
                                f"{self._pending[1]} prompts, verl's global step {global_steps} says {want}; "
                                f"the checkpoint was written by another schedule")
            return
        self._next_epoch = epoch


class _Cursor:
    """The iterator of one epoch; moves the sampler's position as it yields.

    The epoch's order is made at the first ``next()``: torchdata calls ``iter()`` on the
    sampler more than once while restoring a state, and only the last iterator is walked."""

    def __init__(self, sampler: AspSampler, epoch: int, start: int):
        self.s, self.epoch, self.pos = sampler, epoch, start
        self.order: Optional[list[int]] = None

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.order is None:
            self.order = self.s.order(self.epoch)
            self.s._started.add(self.epoch)
        if self.pos >= len(self.order):
            self.s._next_epoch = max(self.s._next_epoch, self.epoch + 1)  # the next iter() is the next epoch
            raise StopIteration
        idx = self.order[self.pos]
        self.pos += 1
        self.s.yielded = self.pos
        return idx


def _split_epochs(schedule) -> dict[int, Any]:
    if schedule is None:
        return {}
    missing = [c for c in SCHEDULE_COLUMNS if c not in schedule.columns]
    if missing:
        raise DataError(f"schedule: missing column(s) {missing}; a schedule has {list(SCHEDULE_COLUMNS)}")
    return {int(e): g for e, g in schedule.groupby("epoch", sort=True)}


def _iterations(frame):
    for key, g in frame.groupby(["iteration"], sort=True):
        yield key, g.to_dict("records")
