"""A rollout instance: one vLLM engine with continuous batching, driven step by step.

:class:`RolloutEngine` is a plain class (the in-process implementation);
:func:`rollout_actor_class` wraps it as a threaded Ray actor. A background thread
runs ``engine.step()`` while requests are unfinished; prompt groups can be submitted
at any time and join the running batch at the next decode step (continuous batching).
Weight updates take the engine lock, so they land *between* decode steps: requests
that are running keep going on the new weights, and each token's behaviour log-prob
(``logprobs_mode=processed_logprobs``: after temperature) is recorded as it is drawn.

Every finished group carries its admission version and time and one record per sample (token
ids, behaviour log-probs, finish reason, the weights behind each token, ...: the format is
engines/rollout_records.py's). ``poll`` also reports the progress of every running group
(lengths of its finished samples, tokens so far of the others) for online re-estimation.

``speculative`` (a dict: vLLM's ``speculative_config``, e.g. ``{"method": "ngram",
"num_speculative_tokens": 3}``): vLLM's own speculative decoding; rejection sampling keeps
the target's distribution, and the recorded log-probs are the target model's (raw log-probs:
vLLM 0.32's processed ones are 0.0/NaN for drafted tokens, so speculation runs at temperature 1
without nucleus, where both agree).

Versions are the engine's own where vLLM labels them (``set_weight_version``, vLLM >= 0.20):
V1's engine core runs in its own process and keeps stepping while this process is busy, so
tokens drawn before a weight update can be handed back after the instance's clock moved on.
The core labels every step's outputs with its current label and a finished completion
carries the label spans of its tokens (``weight_versions``, which become ``segments``); the
label is set right after the reload returns, so a step that slips in between is labelled one
version older than its weights (never newer). Older vLLM: the instance's version when the
step's outputs arrive.

Prefix cache: every request carries ``cache_salt = "v<version>"`` (the version held at its
admission). vLLM folds the salt into the hash of a prompt's first KV block and every later
block chains on it, so a request never reuses KV computed for a request admitted under
other weights (the prefix cache stays on: requests of one version share their prompts' KV).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from ..io import output_to_actor_log
from .rollout_records import Group, finished_group, group_done, new_group, progress, record_output
from .step_lock import StepLock, await_core, core_outputs

EXTENSION = "asp_ascend.engines.vllm_ext.WeightReloadExtension"


def pin_process(cores: list[int]) -> None:
    """Pin this process (and the children it starts later) to ``cores``; size torch's pool."""
    if not cores:
        return
    os.sched_setaffinity(0, set(int(c) for c in cores))
    os.environ["OMP_NUM_THREADS"] = str(len(cores))
    # vLLM-CPU binds its OpenMP threads itself; give it exactly these cores.
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(int(c)) for c in cores)
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"


class RolloutEngine:
    """One vLLM engine. Methods are thread-safe; ``poll`` drains finished groups."""

    def __init__(self, model_dir: str, *, max_num_seqs: int, max_model_len: int, seed: int,
                 kv_cache_gib: float = 1.0, dtype: str = "float32", cpu_cores: list[int] | None = None,
                 instance: int = 0, tensor_parallel_size: int = 1, worker_extension_cls: str = EXTENSION,
                 platform: str = "cpu", gpu_memory_utilization: float = 0.9, speculative: dict | None = None,
                 engine_args: dict | None = None):
        output_to_actor_log()  # logging.actor_output: log -> this process's output goes to train.log
        self.platform = platform
        if platform == "cpu":
            pin_process(list(cpu_cores or []))
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(round(kv_cache_gib)))))
            if not cpu_cores:
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from vllm import LLM

        self.instance = instance
        # tensor_parallel_size > 1: vLLM starts one worker per device (the devices this actor
        # was given); every worker runs the extension, so each receives the weights itself.
        # engine_args: further vLLM engine arguments from the caller (e.g. an integration's executor
        # backend and load format), applied last.
        extra = {} if platform == "cpu" else {"gpu_memory_utilization": gpu_memory_utilization}
        logprobs_mode = "processed_logprobs"
        if speculative:
            extra["speculative_config"] = dict(speculative)
            # vLLM 0.32's processed_logprobs gives 0.0/NaN for drafted tokens; raw log-probs are
            # exact (the caller allows speculation only at temperature 1 without nucleus, where they agree)
            logprobs_mode = "raw_logprobs"
        self.speculative = dict(speculative or {})
        extra.update(engine_args or {})
        # the device's own needs last (CPU: chunked prefill off, a seeded prompt's prefill is never split)
        from ..platforms import get_platform

        extra.update(get_platform(platform, check=False).rollout_engine_args(extra, max_model_len))
        self.llm = LLM(model=model_dir, dtype=dtype, max_model_len=max_model_len, enforce_eager=platform == "cpu",
                       max_num_seqs=max_num_seqs, seed=seed, worker_extension_cls=worker_extension_cls,
                       tensor_parallel_size=int(tensor_parallel_size),
                       logprobs_mode=logprobs_mode, disable_log_stats=True,
                       skip_tokenizer_init=True, **extra)  # prompts arrive as token ids; rewards decode
        self.engine = self.llm.llm_engine
        sched = self.engine.vllm_config.scheduler_config
        if extra.get("enable_chunked_prefill") is False and (sched.enable_chunked_prefill
                                                             or sched.long_prefill_token_threshold):
            self.engine.engine_core.shutdown()
            raise RuntimeError(f"vLLM turned chunked prefill back on (enable_chunked_prefill="
                               f"{sched.enable_chunked_prefill}, long_prefill_token_threshold="
                               f"{sched.long_prefill_token_threshold}) on platform {platform}, where a split "
                               "prefill of a seeded request kills the engine; this vLLM version is not supported")
        self.version = 0
        self._labels = hasattr(self.engine, "set_weight_version")  # the engine core labels its steps
        if self._labels:
            self.engine.set_weight_version("0")
        self._start_loop(instance)

    def _start_loop(self, instance: int, lock: StepLock | None = None) -> None:
        """The step loop's state, then the loop itself (over ``self.engine``; ``lock``: the engine
        lock, a new :class:`StepLock` by default)."""
        self._lock = lock or StepLock()   # engine steps vs callers; fair to callers
        # the run's bookkeeping (groups, finished groups, counters) vs polls: held for bookkeeping
        # only, never across an engine step, so a poll does not wait for the step in progress
        # (lock order: the engine lock, then this one)
        self._state = threading.Lock()
        self._wake = threading.Event()
        self._has_done = threading.Event()
        self._stop = False
        self._groups: dict[str, Group] = {}
        self._done: list[dict] = []
        self._error: BaseException | None = None
        self._busy_s = 0.0
        # decode-step meter (the run measures its own step cost): engine steps, and the running
        # sequences and their context tokens summed over those steps
        self._steps, self._seq_steps, self._ctx_steps = 0, 0, 0
        self._running, self._context = 0, 0
        self._received = 0        # samples ever submitted (the orchestrator's count of those in transit)
        self._wake_below = 0      # poll: also return when a sample finishes leaving fewer unfinished than this
        self._calls: list[dict] = []  # submit calls since the last poll (their timings, ``poll``'s ``submits``)
        self._thread = threading.Thread(target=self._loop, name=f"rollout-{instance}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ requests
    def submit(self, group_id: str, prompt_token_ids: list[int], n: int, max_tokens: int,
               temperature: float, top_p: float, seed: int, stop_token_ids: list[int],
               meta: dict | None = None, prefix: list[dict] | None = None) -> int:
        """Start ``n`` samples of one prompt; returns the version held at admission.

        ``prefix`` (partial rollout: a group that ran on a failed instance resumes here): per
        sample, the ``token_ids``, ``logprobs`` and ``segments`` generated so far and whether it
        ``finished``. An unfinished sample continues as a request for prompt + its prefix with
        the remaining token budget (the prefix is prefilled under this instance's weights; its
        tokens keep their recorded versions and behaviour log-probs). The group's admission
        version is then the oldest version behind any of its tokens."""
        t_call = time.time()
        with self._lock:
            t_locked = time.time()
            self._raise_background()
            version = self._add_group(group_id, prompt_token_ids, n, max_tokens, temperature, top_p, seed,
                                      stop_token_ids, meta, prefix)
            self._log_call(t_call, t_locked, [group_id])
        self._wake.set()
        return version

    def submit_many(self, groups: list[dict]) -> list[int]:
        """:meth:`submit` for several groups (each a dict of its keyword arguments) in ONE hold of
        the engine lock, so no engine step runs between the first and the last group added: an
        instance's burst of admissions (its fill after a weight sync) starts together at the next
        step. One ``submit`` call per group reaches the actor at most ``max_concurrency`` at a time,
        each waiting for the step in progress, so a burst trickled into the engine over several
        steps. Each group is stamped (``t_admit``) when it is added. Returns the admission
        versions, in order."""
        t_call = time.time()
        with self._lock:
            t_locked = time.time()
            self._raise_background()
            versions = []
            for i, g in enumerate(groups):
                if not isinstance(g, dict):
                    raise TypeError(f"submit_many: group {i} is a {type(g).__name__}, not a dict of submit's "
                                    f"keyword arguments (group_id, prompt_token_ids, n, max_tokens, ...)")
                versions.append(self._add_group(**g))
            self._log_call(t_call, t_locked, [g["group_id"] for g in groups])
        self._wake.set()
        return versions

    def _log_call(self, t_call: float, t_locked: float, group_ids: list[str]) -> None:
        """One submit call's path for the next poll (``submits``): when it reached this instance
        (``t_call``), got the engine lock (``t_locked``) and had added its groups (``t_done``)."""
        if group_ids:
            with self._state:
                self._calls.append({"t_call": t_call, "t_locked": t_locked, "t_done": time.time(),
                                    "groups": list(group_ids)})

    def _add_group(self, group_id: str, prompt_token_ids: list[int], n: int, max_tokens: int,
                   temperature: float, top_p: float, seed: int, stop_token_ids: list[int],
                   meta: dict | None = None, prefix: list[dict] | None = None) -> int:
        """Add one group's requests to the engine, stamped now (engine lock held; takes the bookkeeping
        lock for the bookkeeping); its admission version."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        g = new_group(group_id, meta, n, max_tokens, time.time(), self.version, prefix)
        requests = []   # (request id, prompt, params)
        running, context = 0, 0
        for s, rec in g.samples.items():
            if rec["t_finish"] is not None:   # finished in its prefix
                continue
            done_tokens = list(rec["token_ids"])
            sp = SamplingParams(n=1, temperature=temperature, top_p=top_p, max_tokens=max_tokens - len(done_tokens),
                                logprobs=0, seed=seed * 1000 + s, output_kind=RequestOutputKind.DELTA,
                                detokenize=False, stop_token_ids=list(stop_token_ids))
            rec["_ctx"] = len(prompt_token_ids) + len(done_tokens)
            running += 1
            context += rec["_ctx"]
            # the salt of the current version: a prefix resubmitted under v + 1 never reuses KV of v
            requests.append((f"{group_id}#{s}", self._prompt(list(prompt_token_ids) + done_tokens), sp))
        for rid, prompt, sp in requests:   # the engine lock is held: no step runs before the group is known
            self.engine.add_request(rid, prompt, sp)
        with self._state:
            self._groups[group_id] = g
            self._received += n
            self._running += running
            self._context += context
            self._finish_group_if_done(group_id)
        return g.version

    def _prompt(self, prompt_token_ids: list[int]) -> dict:
        """vLLM's prompt for ``prompt_token_ids`` under the current weights: the salt keys its
        prefix-cache blocks by version (call with the lock held)."""
        return {"prompt_token_ids": list(prompt_token_ids), "cache_salt": f"v{self.version}"}

    def _reload(self, blob: bytes, version: int) -> None:
        """Load version ``version``'s serialized weights into every worker (lock held)."""
        self.llm.collective_rpc("asp_load_weights", args=(blob,))
        self._set_version(version)

    def _set_version(self, version: int) -> None:
        """The weights of ``version`` are loaded (lock held): label the engine's next steps."""
        self.version = int(version)
        if self._labels:
            self.engine.set_weight_version(str(self.version))

    def poll(self, wait_s: float = 0.0, wake_below: int = 0) -> dict:
        """Finished groups since the last poll (waits up to ``wait_s`` for one), plus state:
        ``running``, the unfinished samples (running or queued in vLLM), and ``received``, the
        samples ever submitted. ``wake_below`` (> 0, ``rollout.admission: sequences``): also
        return once a sample finishes leaving fewer than that many unfinished (room to admit).
        ``timing``: when this call began, its wait ended (``wake``), it got the lock (``locked``)
        and it returned (``out``); ``submits``: the submit calls since the last poll
        (:meth:`_log_call`). Both for the path from a finish to the next admission
        (``asp_ascend.metrics.admission_latency``).

        A poll takes the bookkeeping lock only, never the engine lock: it returns while an engine
        step is in progress, with everything the steps before it finished (under the engine lock it
        waited for the step that began right after the finish that woke it)."""
        t_call = time.time()
        self._wake_below = int(wake_below)
        if wait_s > 0:
            self._has_done.wait(timeout=wait_s)
        t_wake = time.time()
        with self._state:
            t_locked = time.time()
            self._has_done.clear()
            self._raise_background()
            done, self._done = self._done, []
            calls, self._calls = self._calls, []
            running = sum(1 for g in self._groups.values() for s in g.samples.values() if s["t_finish"] is None)
            return {"groups": done, "running": running, "received": self._received, "version": self.version,
                    "busy_s": self._busy_s,
                    "meter": {"steps": self._steps, "seq_steps": self._seq_steps, "ctx_steps": self._ctx_steps,
                              "busy_s": self._busy_s},
                    "progress": progress(self._groups.values()), "submits": calls,
                    "timing": {"call": t_call, "wake": t_wake, "locked": t_locked, "out": time.time()}}

    def status(self) -> dict:
        """What runs now, without draining anything: version, running samples, their tokens so far and
        how many of those a poll has already reported."""
        with self._state:
            live = [(g, s, r) for g in self._groups.values() for s, r in g.samples.items() if r["t_finish"] is None]
            return {"version": self.version, "running": len(live),
                    "tokens": sum(len(r["token_ids"]) for _, _, r in live),
                    # tokens of running samples already handed out by a poll (the caller holds them as prefixes)
                    "reported": sum(max(0, g.sent.get(s, 0)) for g, s, _ in live)}

    # ------------------------------------------------------------------ weights
    def update_weights(self, ticket, group: dict | None = None) -> dict:
        """Receive a new policy version (a ``WeightTicket``) between decode steps.

        A ticket with a payload came through the Ray object store. Without one, the weights
        arrive over the broadcast ``group`` (``{"gen", "host", "port", "world", "rank", "platform"}``,
        ``rank`` = this instance's first rank) while the trainer sends: every vLLM worker joins.
        """
        from ..platforms.transport import RayObjectStoreTransport

        t0 = time.time()
        if ticket.payload is not None:
            blob = RayObjectStoreTransport().recv_bytes(ticket)
            with self._lock:
                if int(ticket.version) >= self.version:  # concurrent calls: never go back a version
                    self._reload(blob, int(ticket.version))
        else:
            if group is None:
                raise ValueError("update_weights: a ticket without payload needs the broadcast group")
            with self._lock:  # a broadcast is never skipped: the sender waits for every rank
                out = self.llm.collective_rpc("asp_recv_broadcast", args=(ticket.layout(), int(ticket.version),
                                                                          dict(group)))
                errors = [o for o in out if isinstance(o, str)]
                if errors:
                    raise RuntimeError(f"instance {self.instance}: weight broadcast of version {ticket.version} "
                                       f"failed in {len(errors)} worker(s): {errors[0]}")
                self._set_version(max(self.version, int(ticket.version)))
        return {"t_start": t0, "t_end": time.time(), "version": self.version}

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list:
        """Run ``method`` of the worker extension in every vLLM worker of this instance (between
        decode steps); returns the workers' results."""
        with self._lock:
            return self.llm.collective_rpc(method, args=tuple(args), kwargs=kwargs)

    def sequence_logprobs(self, prompt_token_ids: list[int], response_token_ids: list[int]) -> list[float]:
        """Log-probs the engine's current weights give each response token (prompt log-probs)."""
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        ids = list(prompt_token_ids) + list(response_token_ids)
        with self._lock:
            out = self.llm.generate([self._prompt(ids)], sp, use_tqdm=False)[0]
        plp = out.prompt_logprobs
        start = len(prompt_token_ids)
        return [float(plp[j][ids[j]].logprob) for j in range(start, len(ids))]

    def warm_up(self, prompts: list[list[int]], num_seqs: int, max_tokens: int, temperature: float = 1.0,
                top_p: float = 1.0) -> dict:
        """One throw-away generation before the run's first iteration, so the engine's one-time
        costs are not paid inside it: vLLM compiles its sampler's log-prob kernel
        (``torch.compile``) at the first request that asks for log-probs (measured on vLLM-CPU
        0.32: the first iteration's first tokens came 3-4 s after admission, later ones in
        0.14 s), and the first steps at each batch size are slower.

        ``num_seqs`` sequences (the ``prompts`` in turn), sampled as the run samples
        (``temperature``, ``top_p``, seeded, one log-prob per token), decode with ``ignore_eos``
        and budgets spread from ``max_tokens`` down to 1, so the running batch shrinks one
        sequence at a time through every size from ``num_seqs`` to 1. Runs under the engine
        lock (nothing of the run is in flight yet), with its own ``cache_salt`` (no prefix-cache
        entry is shared with the run's requests) and outside the decode-step meter (the run's
        step costs stay its own). Returns ``{"sequences", "tokens", "seconds"}``."""
        from vllm import SamplingParams

        if not prompts or num_seqs < 1 or max_tokens < 1:
            raise ValueError(f"warm_up: needs prompts, num_seqs >= 1 and max_tokens >= 1 "
                             f"(got {len(prompts)} prompt(s), {num_seqs}, {max_tokens})")
        n = int(num_seqs)
        reqs, params = [], []
        for j in range(n):
            budget = max(1, int(round(max_tokens * (n - j) / n)))
            reqs.append({"prompt_token_ids": list(prompts[j % len(prompts)]), "cache_salt": "warm-up"})
            params.append(SamplingParams(n=1, temperature=temperature, top_p=top_p, max_tokens=budget,
                                         ignore_eos=True, seed=j, logprobs=0, detokenize=False))
        t0 = time.time()
        with self._lock:
            self._raise_background()
            outs = self.llm.generate(reqs, params, use_tqdm=False)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        return {"sequences": n, "tokens": tokens, "seconds": time.time() - t0}

    def ready(self) -> int:
        return self.instance

    def workers(self) -> list[dict]:
        """The vLLM workers of this instance (one per tensor-parallel rank): rank and device."""
        return self.collective_rpc("asp_worker_info")

    def shutdown(self) -> None:
        """Stop the step loop, then the vLLM engine: its engine-core process exits cleanly and
        unlinks its shared-memory queues (a process killed with the actor would leave them in /dev/shm)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)
        from .shm import segments_of_children, unlink

        owned = segments_of_children()  # the engine core's queues (it never unlinks them itself)
        core = getattr(self.engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            with self._lock:
                core.shutdown()
        unlink(owned)

    # ------------------------------------------------------------------ loop
    def _raise_background(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"rollout instance {self.instance} failed: {self._error!r}") from self._error

    def _loop(self) -> None:
        core = core_outputs(self.engine)
        try:
            while not self._stop:
                # the step's clock and version label start where its wait for the engine starts
                t0, step_version = time.time(), self.version  # (older vLLM: no labels from the engine core)
                if core is not None:
                    await_core(core, self.engine, lambda: self._stop)
                with self._lock.for_step():
                    has_work = self.engine.has_unfinished_requests()
                    # with the core's queue: step only on a queued output (work that came after the
                    # wait, or an output a caller's own stepping took, sends the loop back to the wait)
                    if has_work and (core is None or core.qsize()):
                        if core is None:
                            t0, step_version = time.time(), self.version
                        outputs = self.engine.step()
                        now = time.time()
                        with self._state:
                            self._busy_s += now - t0
                            self._steps += 1
                            self._seq_steps += self._running
                            self._ctx_steps += self._context
                            self._collect(outputs, now, step_version)
                if not has_work:
                    self._wake.wait(timeout=0.05)
                    self._wake.clear()
        except BaseException as exc:  # re-raised to the orchestrator on the next call
            self._error = exc
            self._has_done.set()

    def _collect(self, outputs: list[Any], now: float, step_version: int) -> None:
        for out in outputs:
            gid, _, s = out.request_id.rpartition("#")
            g = self._groups.get(gid)
            if g is None:
                continue
            rec = g.samples[int(s)]
            drawn = record_output(rec, out, now, step_version, self._labels)
            if "_ctx" in rec:
                rec["_ctx"] += drawn
                self._context += drawn
            if out.finished:
                if "_ctx" in rec:  # leaves the running batch
                    self._running -= 1
                    self._context -= rec.pop("_ctx")
                    if self._running < self._wake_below:   # room to admit: the next poll returns now
                        self._has_done.set()
                self._finish_group_if_done(gid)

    def _finish_group_if_done(self, gid: str) -> None:
        """Hand group ``gid`` to the next poll once all its samples are finished (bookkeeping lock held)."""
        g = self._groups[gid]
        if group_done(g):
            del self._groups[gid]
            self._done.append(finished_group(g, self.instance, self.speculative.get("num_speculative_tokens", 0)))
            self._has_done.set()


def rollout_actor_class():
    """``RolloutEngine`` as a Ray actor class (threaded: polls and syncs run beside the loop)."""
    import ray

    return ray.remote(max_concurrency=4)(RolloutEngine)
