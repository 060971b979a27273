"""System policies: pipeline mode + dispatch policy + lag bound + device split.

==================  ==========  ==========  ======  ===========================================
policy              dispatch    lag bound   train   devices
==================  ==========  ==========  ======  ===========================================
sync_colocated      fifo        0           whole   all D devices: R = D / infer_tp vLLM replicas
                                            iter.   generate, then the trainer uses all D (+ switch)
single_instance     fifo        k           stream  one instance over all rollout devices (TP)
one_step_off        fifo        1 exactly   whole   decoupled: R = rollout_devices / infer_tp;
                                            iter.   batch i+1 generates while batch i trains
fully_async_fifo    fifo        k           stream  decoupled, hot weight swap after every sync
async_sorted        sorted      k           stream  decoupled
async_random        random      k           stream  decoupled
async_balanced      balanced    k           stream  decoupled
asp                 asp         k           stream  decoupled, planned once from the history
asp_adaptive        asp         k           stream  decoupled, re-planned each epoch from the
                                                    lengths observed so far
asp_partial         asp         k (+S)      stream  asp with partial rollout (carry-over, DESIGN 9 e):
                                                    deferred samples' lag up to k + rollout.max_split
==================  ==========  ==========  ======  ===========================================

``k`` = ``pipeline.lag_bound``. fifo/random/sorted instances pull from one shared queue
(MindSpeed-RL's replicas pull from the TransferDock the same way); asp/balanced bind prompts
to instances. "stream": an optimizer step starts as soon as its mini-batch is generated;
"whole iter.": the trainer waits for the whole iteration (MindSpeed-RL, verl one-step-off).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..scheduler.execution import ExecutionSettings


@dataclass(frozen=True)
class SystemSpec:
    name: str
    dispatch: str          # planner policy
    lag_bound: int
    stream_train: bool
    colocated: bool
    barrier: bool          # one-step-off: instances take new weights only between batches
    single_instance: bool
    adaptive: bool
    num_instances: int
    tp: int                # devices per rollout instance
    train_devices: int
    max_num_seqs: int
    partial: bool = False  # partial rollout with carry-over (asp_partial)

    @property
    def devices(self) -> int:
        return self.train_devices if self.colocated else self.num_instances * self.tp + self.train_devices

    def execution(self, group_size: int, dispatch: str = "static") -> ExecutionSettings:
        """What the engine's admission needs: the dispatch policy's queue, k, instances, concurrency."""
        return ExecutionSettings(policy=self.dispatch, lag_bound=self.lag_bound, sync_mode=not self.stream_train,
                                 group_size=group_size, max_num_seqs=self.max_num_seqs,
                                 num_instances=self.num_instances, dispatch=dispatch, adaptive=self.adaptive)


POLICY_NAMES = ("sync_colocated", "single_instance", "one_step_off", "fully_async_fifo", "async_sorted",
                "async_random", "async_balanced", "asp", "asp_adaptive", "asp_partial")

_DISPATCH = {"sync_colocated": "fifo", "single_instance": "fifo", "one_step_off": "fifo",
             "fully_async_fifo": "fifo", "async_sorted": "sorted", "async_random": "random",
             "async_balanced": "balanced", "asp": "asp", "asp_adaptive": "asp", "asp_partial": "asp"}


def system_spec(name: str, *, total_devices: int, rollout_devices: int, infer_tp: int, lag_bound: int,
                max_num_seqs: int) -> SystemSpec:
    """The system ``name`` on ``total_devices`` devices (``rollout_devices`` of them for rollout
    when rollout and training are decoupled)."""
    if name not in POLICY_NAMES:
        raise ConfigError([f"sim.policies: unknown system policy {name!r}; valid: {', '.join(POLICY_NAMES)}"])
    D, Dr, tp = int(total_devices), int(rollout_devices), int(infer_tp)
    if name == "sync_colocated":
        if D < tp:
            raise ConfigError([f"sim.infer_tp: {tp} exceeds sim.total_devices={D}"])
        return SystemSpec(name, "fifo", 0, False, True, False, False, False, D // tp, tp, D, max_num_seqs)
    if Dr < 1 or Dr >= D:
        raise ConfigError([f"sim.rollout_devices: {Dr} must be between 1 and sim.total_devices-1={D - 1}"])
    if name == "single_instance":
        # the same total concurrency as the multi-instance split, one engine over all rollout devices
        reps = max(1, Dr // tp)
        return SystemSpec(name, "fifo", lag_bound, True, False, False, True, False, 1, Dr, D - Dr,
                          max_num_seqs * reps)
    if Dr < tp:
        raise ConfigError([f"sim.rollout_devices: {Dr} is fewer than sim.infer_tp={tp} (one instance)"])
    R = Dr // tp
    if name == "one_step_off":
        return SystemSpec(name, "fifo", 1, False, False, True, False, False, R, tp, D - Dr, max_num_seqs)
    return SystemSpec(name, _DISPATCH[name], lag_bound, True, False, False, False, name == "asp_adaptive",
                      R, tp, D - Dr, max_num_seqs, partial=name == "asp_partial")


def check_points(cfg, names: list[str]) -> None:
    """Every simulated point (the main one, each ``sim.sweep_devices`` and
    ``sim.sweep_rollout_devices`` entry) is valid, and a ``data.path`` workload has its lengths
    (``lengths.path``), checked before any output is written; ConfigError naming the key the user
    set and every problem at once."""
    s = cfg.sim
    tp, D, Dr = int(s.infer_tp), int(s.total_devices), int(s.rollout_devices)
    p: list[str] = []
    bad = [n for n in names if n not in POLICY_NAMES]
    if bad or not names:
        p.append(f"sim.policies: unknown {', '.join(map(repr, bad)) if bad else 'empty list'}; valid: "
                 f"{', '.join(POLICY_NAMES)} (e.g. sim.policies=[asp,fully_async_fifo])")
    if tp >= 1:
        if 1 <= Dr < D and Dr % tp:
            p.append(f"sim.infer_tp: {tp} does not divide sim.rollout_devices={Dr}: {Dr // tp} instance(s) would use "
                     f"{Dr // tp * tp} devices and {Dr % tp} would idle; use an infer_tp that divides {Dr}, or "
                     f"rollout_devices={max(tp, Dr // tp * tp)}")
        if "sync_colocated" in names and D % tp:
            p.append(f"sim.infer_tp: {tp} does not divide sim.total_devices={D} (sync_colocated runs D / infer_tp "
                     f"replicas; {D % tp} device(s) would idle)")
    for v in s.sweep_devices:
        if not isinstance(v, int) or isinstance(v, bool) or v < max(2, tp + 1):
            p.append(f"sim.sweep_devices: {v!r} is not a device count of at least {max(2, tp + 1)} (one rollout "
                     f"instance of sim.infer_tp={tp} devices plus one trainer device)")
        elif "sync_colocated" in names and tp >= 1 and v % tp:
            p.append(f"sim.sweep_devices: {v} is not a multiple of sim.infer_tp={tp} (sync_colocated would idle "
                     f"{v % tp} device(s))")
    for v in s.sweep_rollout_devices:
        if not isinstance(v, int) or isinstance(v, bool) or not tp <= v < D or (tp >= 1 and v % tp):
            p.append(f"sim.sweep_rollout_devices: {v!r} must be a multiple of sim.infer_tp={tp} between {tp} and "
                     f"sim.total_devices-1={D - 1}")
    if cfg.data.path and not cfg.lengths.path:   # the workload is data.path's prompts (lengths/workloads.py)
        from ..lengths.workloads import dataset_needs_lengths

        p.append(dataset_needs_lengths(cfg))
    if p:
        raise ConfigError(p)
