"""In-process rollout instances with the runtime engine's submit/poll, scripted for the MindSpeed-RL
sample-source tests (test_mindspeed_sample_source.py, test_mindspeed_adaptive.py)."""
from __future__ import annotations


class StepInstance:
    """An in-process instance with the runtime engine's submit/poll: a group finishes after
    ``length`` polls (decode steps); tokens are deterministic, log-probs recorded per token."""

    def __init__(self, idx: int):
        self.idx, self.version, self.running, self.max_running = idx, 0, [], 0

    def submit(self, group_id, prompt_token_ids, n, max_tokens, temperature, top_p, seed, stop_token_ids, meta=None):
        length = 1 + (sum(prompt_token_ids) % 5)
        self.running.append({"group_id": group_id, "meta": meta, "left": length, "n": n, "len": length,
                             "version": self.version, "t": float(len(self.running))})
        self.max_running = max(self.max_running, len(self.running))
        return self.version

    def poll(self):
        done = []
        for g in list(self.running):
            g["left"] -= 1
            if g["left"] <= 0:
                self.running.remove(g)
                done.append({"group_id": g["group_id"], "meta": g["meta"], "instance": self.idx,
                             "admission_version": g["version"], "t_admit": g["t"],
                             "samples": [{"token_ids": [s] * g["len"], "logprobs": [-0.5] * g["len"],
                                          "t_finish": g["t"] + g["len"]} for s in range(g["n"])]})
        return {"groups": done}


class LengthInstance(StepInstance):
    """StepInstance whose group lengths come from a table (prompt id -> decode steps)."""

    def __init__(self, idx, lengths):
        super().__init__(idx)
        self.lengths = lengths

    def submit(self, group_id, prompt_token_ids, n, max_tokens, temperature, top_p, seed, stop_token_ids, meta=None):
        v = super().submit(group_id, prompt_token_ids, n, max_tokens, temperature, top_p, seed, stop_token_ids, meta)
        g = self.running[-1]
        g["left"] = g["len"] = self.lengths[meta["prompt_id"]]
        return v
