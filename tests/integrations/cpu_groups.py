"""CPU worker groups implementing the async loop's Protocols with real computation (torch CPU).

A table policy (one softmax over the vocabulary per context token) is enough to be a real
RL problem: the reward of a sample is the fraction of its tokens equal to the prompt's
label, GRPO has to find it. Rollout instances hold their own copy of the weights and are
fed through the shared admission state machine (asp_ascend.scheduler.admission), so stale
samples really come from older weights.

Where it matters they behave like MindSpeed-RL's: they exchange rows through a TransferDock
(:mod:`td_standin`) whose worker writes land late, and the actor group shards the update's rows
by data-parallel rank as MindSpeed-RL's does with ``guarantee_order``.
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch

from asp_ascend.integrations.mindspeed_rl.async_loop import SampleGroup
from asp_ascend.platforms.transport import InProcessTransport
from asp_ascend.scheduler.admission import AdmissionController, Dispatcher, Job
from td_standin import TransferDock, unpad


class TablePolicy(torch.nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(vocab, vocab))

    def log_probs(self, prompt: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.table[int(prompt[0])], dim=-1)[response]


def _read(dock: TransferDock, consumer: str, columns, indexes) -> dict[str, list]:
    """A worker's read: through the dock's waiting API, as MindSpeed-RL's dispatch_transfer_dock_data."""
    batch, _ = dock.get_experience(consumer, list(columns), indexes=list(indexes), get_n_samples=False)
    return unpad(batch)


def rank_rows(num_rows: int, dp: int, d: int) -> list[int]:
    """Rows data-parallel rank d trains with guarantee_order: [d*E, (d+1)*E) (get_current_dp_range_indexes)."""
    e = num_rows // dp
    return list(range(d * e, (d + 1) * e))


class CpuActorGroup:
    """ActorGroup with MindSpeed-RL's data-parallel semantics: rank d trains rows [d*E, (d+1)*E) in
    consecutive mini-batches of mb*n/dp rows, and optimizer step m is the union of every rank's m-th
    piece (one optimizer step over the gradients of all ranks). Results go to the dock unwaited."""

    def __init__(self, dock: TransferDock, vocab: int, group_size: int, mini_batch_prompts: int, lr: float,
                 dp: int = 1, clip: float = 0.2, with_ref: bool = True, clock=time.monotonic):
        self.dock, self.n, self.mb, self.dp, self.clip, self.clock = dock, group_size, mini_batch_prompts, dp, clip, clock
        # MindSpeed-RL's actor_train consumer reads ref_log_prob too (the KL term): it waits for the ref's write
        self.columns = ["prompts", "responses", "advantages", "old_log_prob"] + (["ref_log_prob"] if with_ref else [])
        self.policy = TablePolicy(vocab)
        self.opt = torch.optim.SGD(self.policy.parameters(), lr=lr)
        self.log_prob_calls = 0
        self.updates = 0

    def compute_log_prob(self, blocking=False):
        self.log_prob_calls += 1
        for d in range(self.dp):
            idx = rank_rows(self.dock.max_len, self.dp, d)
            cols = _read(self.dock, "actor_log_prob", ["prompts", "responses"], idx)
            with torch.no_grad():
                old = [self.policy.log_probs(p, r) for p, r in zip(cols["prompts"], cols["responses"])]
            self.dock.put_unwaited({"old_log_prob": old}, idx)

    def update(self, kl_ctrl, skip_actor_log_prob):
        if skip_actor_log_prob:
            raise AssertionError("the async loop must never skip the old log-prob")
        self.updates += 1
        per = self.mb * self.n // self.dp
        ranks = [rank_rows(self.dock.max_len, self.dp, d) for d in range(self.dp)]
        steps = []
        for m in range(len(ranks[0]) // per):
            t0 = self.clock()
            rows = [r for d in range(self.dp) for r in ranks[d][m * per:(m + 1) * per]]
            cols = _read(self.dock, "actor_train", self.columns, rows)
            terms, tokens, longest = [], 0, 0
            for k in range(len(rows)):
                p, resp = cols["prompts"][k], cols["responses"][k]
                lp = self.policy.log_probs(p, resp)
                ratio = torch.exp(lp - cols["old_log_prob"][k])
                adv = cols["advantages"][k]
                terms.append(torch.max(-adv * ratio, -adv * ratio.clamp(1 - self.clip, 1 + self.clip)))
                tokens += len(p) + len(resp)
                longest = max(longest, len(p) + len(resp))
            loss = torch.cat(terms).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            steps.append({"t_start": t0, "t_end": self.clock(), "mini_batch": m, "rows": rows,
                          "tokens": tokens, "padded_tokens": longest * len(rows) - tokens})
        return steps

    def wait_all_ref_objs_run_over(self):
        pass   # the worker calls have returned; their dock writes may still be in flight

    def named_weights(self):
        return list(self.policy.state_dict().items())


class CpuRefGroup:
    def __init__(self, dock: TransferDock, vocab: int):
        self.dock, self.policy, self.calls = dock, TablePolicy(vocab), 0

    def compute_ref_log_prob(self, blocking=False):
        self.calls += 1
        idx = list(range(self.dock.max_len))
        cols = _read(self.dock, "ref_log_prob", ["prompts", "responses"], idx)
        with torch.no_grad():
            ref = [self.policy.log_probs(p, r) for p, r in zip(cols["prompts"], cols["responses"])]
        self.dock.put_unwaited({"ref_log_prob": ref}, idx)

    def wait_all_ref_objs_run_over(self):
        pass


def rule_reward(dock: TransferDock):
    idx = list(range(dock.max_len))
    cols = _read(dock, "rule_reward", ["responses", "labels"], idx)
    scores = [torch.tensor([float((r == int(lab)).float().mean())]) for r, lab in zip(cols["responses"], cols["labels"])]
    dock.put_unwaited({"rm_scores": scores}, idx)


def group_norm_advantage(dock: TransferDock, n: int):
    """MindSpeed-RL's compute_advantage: group-normalised scores, written without waiting."""
    idx = list(range(dock.max_len))
    cols = _read(dock, "compute_advantage", ["rm_scores", "response_length"], idx)
    scores = torch.cat(cols["rm_scores"]).reshape(-1, n)
    norm = (scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)
    adv = [torch.full((int(L),), float(a)) for L, a in zip(torch.cat(cols["response_length"]), norm.reshape(-1))]
    dock.put_unwaited({"advantages": adv}, idx)


class CpuRolloutPool:
    """SampleSource: R instances with their own weights, fed by the Dispatcher under the lag bound.

    Generation is pumped deterministically: when the trainer asks for iteration i, every
    instance generates whatever the admission rule and the queue capacity allow (so with
    k >= 1 later iterations are produced ahead, by older weights).
    """

    def __init__(self, schedule, num_instances: int, group_size: int, lag_bound: int, vocab: int,
                 capacity_groups: int, seed: int = 0, clock=time.monotonic):
        self.R, self.n, self.vocab, self.capacity, self.clock = num_instances, group_size, vocab, capacity_groups, clock
        self.adm = AdmissionController(lag_bound, num_instances)
        jobs = [Job(int(r.iteration), int(r.dispatch_rank), str(r.prompt_id), int(r.epoch), int(r.instance),
                    int(r.mini_batch), float(r.predicted_length)) for r in schedule.itertuples()]
        self.disp = Dispatcher(jobs, num_instances, self.adm)
        self.policies = [TablePolicy(vocab) for _ in range(num_instances)]
        self.ready: dict[int, list[SampleGroup]] = defaultdict(list)
        self.gen = torch.Generator().manual_seed(seed)
        self.transport = InProcessTransport()
        self.generated = 0

    def _buffered(self) -> int:
        return sum(len(v) for v in self.ready.values())

    def _generate(self, inst: int, job: Job, version: int) -> SampleGroup:
        label = int(job.prompt_id) % self.vocab
        prompt = [label, (label + 1) % self.vocab]
        length = max(1, int(job.predicted_length))
        t_admit = self.clock()
        pol = self.policies[inst]
        with torch.no_grad():
            probs = torch.softmax(pol.table[label], -1)
            resps, lps = [], []
            for _ in range(self.n):
                tok = torch.multinomial(probs, length, replacement=True, generator=self.gen)
                resps.append(tok.tolist())
                lps.append(pol.log_probs(torch.tensor(prompt), tok).tolist())
        self.generated += 1
        return SampleGroup(epoch=job.epoch, prompt_id=job.prompt_id, iteration=job.iteration,
                           mini_batch=job.mini_batch, instance=inst, admission_version=version, prompt=prompt,
                           responses=resps, rollout_log_probs=lps, extras={"labels": [label]},
                           t_admit=t_admit, t_finish=self.clock())

    def pump(self) -> bool:
        progressed = True
        any_work = False
        while progressed and self._buffered() < self.capacity:
            progressed = False
            for inst in range(self.R):
                if self._buffered() >= self.capacity:
                    break
                nxt = self.disp.next_for(inst)
                if nxt is None:
                    continue
                job, version = nxt
                self.ready[job.iteration].append(self._generate(inst, job, version))
                self.disp.on_finish(job.prompt_id, job.epoch)
                progressed = any_work = True
        return any_work

    def get_groups(self, iteration: int, count: int):
        while len(self.ready[iteration]) < count:
            if not self.pump():
                raise RuntimeError(f"iteration {iteration}: {len(self.ready[iteration])}/{count} groups and no "
                                   f"instance can admit more (lag bound or capacity deadlock)")
        out = self.ready.pop(iteration)
        if len(out) != count:
            raise RuntimeError(f"iteration {iteration}: {len(out)} groups ready, expected {count}")
        return out

    def publish(self, version: int, named_weights) -> None:
        ticket = self.transport.prepare(version, named_weights)
        self.transport.send(ticket, named_weights)
        self.adm.on_publish(version)
        for inst, pol in enumerate(self.policies):
            pol.load_state_dict(dict(self.transport.recv(ticket)))
            self.adm.on_instance_synced(inst, version)
