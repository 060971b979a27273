"""Evaluation during a run: greedy answers to the held-out prompts at a policy version.

The evaluator only decides: which request goes to which live instance, and what a returned
answer scores. The loop sends its requests and hands it the groups marked ``eval``.
A version's evaluation is complete when every prompt has answered; its row
(``eval_version``, ``eval_reward_mean``, ``eval_accuracy``) goes to eval.jsonl and into the
next metrics row. Requests on an instance that fails are sent again to the survivors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class Prompts:
    token_ids: dict[str, list[int]]
    answers: dict[str, str | None]


@dataclass
class EvalRequest:
    """One ``submit`` to instance ``instance`` (greedy, one sample)."""
    instance: int
    group_id: str
    token_ids: list[int]
    meta: dict


class Evaluator:
    def __init__(self, prompts: Prompts, every: int, reward_fn: Callable, decode: Callable[[list[int]], str]):
        self.prompts = prompts
        self.every = every
        self.reward_fn = reward_fn
        self.decode = decode
        self.pending: dict[int, dict] = {}
        self.where: dict[tuple[int, str], int] = {}  # (version, prompt) -> instance, until it returns
        self.rows: list[dict] = []                   # complete evaluations not yet in a metrics row

    def due(self, version: int, last: int) -> bool:
        """After the sync of ``version``: every ``every`` versions, except the last one (the
        loop evaluates the final weights once the run has ended)."""
        return bool(self.every) and version % self.every == 0 and version < last

    def start(self, version: int, live: list[int]) -> list[EvalRequest]:
        if not self.prompts.token_ids or version in self.pending:
            return []
        self.pending[version] = {"n": len(self.prompts.token_ids), "rewards": []}
        return [self._request(version, pid, j, live) for j, pid in enumerate(self.prompts.token_ids)]

    def reassign(self, failed: int, live: list[int]) -> list[EvalRequest]:
        """The requests that were on instance ``failed``, spread over ``live``."""
        lost = [key for key, where in self.where.items() if where == failed]
        return [self._request(v, pid, j, live) for j, (v, pid) in enumerate(lost)]

    def _request(self, version: int, pid: str, j: int, live: list[int]) -> EvalRequest:
        r = live[j % len(live)]
        self.where[(version, pid)] = r
        return EvalRequest(r, f"eval-v{version}:{pid}", self.prompts.token_ids[pid],
                           {"eval": True, "version": version, "prompt_id": pid})

    def on_group(self, g: dict) -> dict | None:
        """Score one answer; returns the version's row once its last answer is in."""
        meta = g["meta"]
        v = meta["version"]
        self.where.pop((v, meta["prompt_id"]), None)
        ans = self.prompts.answers.get(meta["prompt_id"])
        e = self.pending[v]
        e["rewards"].append(float(self.reward_fn(self.decode(g["samples"][0]["token_ids"]), ans)))
        if len(e["rewards"]) < e["n"]:
            return None
        del self.pending[v]
        rw = np.asarray(e["rewards"])
        row = {"eval_version": v, "eval_reward_mean": float(rw.mean()), "eval_accuracy": float((rw >= 1.0).mean())}
        self.rows.append(row)
        return row

    def take_rows(self) -> list[dict]:
        rows, self.rows = self.rows, []
        return rows
