"""CPU worker groups implementing the async loop's Protocols with real computation (torch CPU).

A table policy (one softmax over the vocabulary per context token) is enough to be a real
RL problem: the reward of a sample is the fraction of its tokens equal to the prompt's
label, GRPO has to find it. Rollout instances hold their own copy of the weights and are
fed through the shared admission state machine (asp_ascend.scheduler.admission), so stale
samples really come from older weights.
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch

from asp_ascend.integrations.mindspeed_rl.async_loop import SampleGroup
from asp_ascend.platforms.transport import InProcessTransport
from asp_ascend.scheduler.admission import AdmissionController, Dispatcher, Job


class TablePolicy(torch.nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(vocab, vocab))

    def log_probs(self, prompt: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.table[int(prompt[0])], dim=-1)[response]


class ColumnStore:
    """ExperienceStore: a column dict of per-row tensors (what MindSpeed-RL's TransferDock keeps)."""

    def __init__(self):
        self.cols: dict[str, dict[int, torch.Tensor]] = {}
        self.clears = 0

    def put_experience(self, data_dict, indexes, is_prompt=False):
        for k, vals in data_dict.items():
            if len(vals) != len(indexes):
                raise ValueError(f"column {k}: {len(vals)} values for {len(indexes)} rows")
            col = self.cols.setdefault(k, {})
            for i, v in zip(indexes, vals):
                col[i] = v

    def read_columns(self, columns, indexes):
        return {c: [self.cols[c][i] for i in indexes] for c in columns}

    def clear_main(self):
        self.cols = {}
        self.clears += 1

    @property
    def indexes(self):
        return sorted(self.cols["responses"])


class CpuActorGroup:
    """ActorGroup: old log-probs and PPO-clip updates, one optimizer step per mini-batch."""

    def __init__(self, store: ColumnStore, vocab: int, rows_per_mini_batch: int, lr: float, clip: float = 0.2,
                 clock=time.monotonic):
        self.store, self.mb_rows, self.clip, self.clock = store, rows_per_mini_batch, clip, clock
        self.policy = TablePolicy(vocab)
        self.opt = torch.optim.SGD(self.policy.parameters(), lr=lr)
        self.log_prob_calls = 0
        self.updates = 0

    def compute_log_prob(self, blocking=False):
        self.log_prob_calls += 1
        idx = self.store.indexes
        cols = self.store.read_columns(["prompts", "responses"], idx)
        with torch.no_grad():
            old = [self.policy.log_probs(p, r) for p, r in zip(cols["prompts"], cols["responses"])]
        self.store.put_experience({"old_log_prob": old}, idx)

    def update(self, kl_ctrl, skip_actor_log_prob):
        if skip_actor_log_prob:
            raise AssertionError("the async loop must never skip the old log-prob")
        self.updates += 1
        idx = self.store.indexes
        cols = self.store.read_columns(["prompts", "responses", "advantages", "old_log_prob"], idx)
        steps = []
        for m, lo in enumerate(range(0, len(idx), self.mb_rows)):
            t0 = self.clock()
            rows = range(lo, lo + self.mb_rows)
            terms, tokens, longest = [], 0, 0
            for r in rows:
                lp = self.policy.log_probs(cols["prompts"][r], cols["responses"][r])
                ratio = torch.exp(lp - cols["old_log_prob"][r])
                adv = cols["advantages"][r]
                terms.append(torch.max(-adv * ratio, -adv * ratio.clamp(1 - self.clip, 1 + self.clip)))
                tokens += len(cols["prompts"][r]) + len(cols["responses"][r])
                longest = max(longest, len(cols["prompts"][r]) + len(cols["responses"][r]))
            loss = torch.cat(terms).mean()
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            steps.append({"t_start": t0, "t_end": self.clock(), "mini_batch": m, "rows": (lo, lo + self.mb_rows),
                          "tokens": tokens, "padded_tokens": longest * self.mb_rows - tokens})
        return steps

    def wait_all_ref_objs_run_over(self):
        pass

    def named_weights(self):
        return list(self.policy.state_dict().items())


class CpuRefGroup:
    def __init__(self, store: ColumnStore, vocab: int):
        self.store, self.policy, self.calls = store, TablePolicy(vocab), 0

    def compute_ref_log_prob(self, blocking=False):
        self.calls += 1
        idx = self.store.indexes
        cols = self.store.read_columns(["prompts", "responses"], idx)
        with torch.no_grad():
            ref = [self.policy.log_probs(p, r) for p, r in zip(cols["prompts"], cols["responses"])]
        self.store.put_experience({"ref_log_prob": ref}, idx)

    def wait_all_ref_objs_run_over(self):
        pass


def rule_reward(store: ColumnStore):
    idx = store.indexes
    cols = store.read_columns(["responses", "labels"], idx)
    scores = [torch.tensor([float((r == int(lab)).float().mean())]) for r, lab in zip(cols["responses"], cols["labels"])]
    store.put_experience({"rm_scores": scores}, idx)


def group_norm_advantage(store: ColumnStore, n: int):
    idx = store.indexes
    cols = store.read_columns(["rm_scores", "response_length"], idx)
    scores = torch.cat(cols["rm_scores"]).reshape(-1, n)
    norm = (scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-6)
    adv = [torch.full((int(L),), float(a)) for L, a in zip(torch.cat(cols["response_length"]), norm.reshape(-1))]
    store.put_experience({"advantages": adv}, idx)


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
                           responses=resps, rollout_log_probs=lps, extras={"labels": label},
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
