"""A rollout instance's per-sample records: built at admission, fed by every engine step, reported.

:class:`~asp_ascend.engines.rollout.RolloutEngine` keeps one :class:`Group` per running prompt
group, one record (a dict) per sample, and holds the locks; the functions here are the record's
format, which every finished group hands on per sample: ``token_ids``, per-token behaviour
``logprobs``, vLLM's ``finish_reason`` (``stop`` | ``length``), the version of the weights that
drew its first and last tokens (``version_first``, ``version_last``), ``segments`` (``[[first
token, version], ...]``: which weights drew each token; a request that spans weight syncs has one
segment per version), the number of engine steps that produced tokens (``steps``: with
speculative decoding a step can yield several tokens), vLLM's prefix-cache hit
(``cached_tokens``), and wall-clock times of first token and finish (``t_first_token``,
``t_finish``). Keys with a leading underscore are the instance's own and never leave it
(``_ctx``: the context a running sample adds to the step meter; ``_drawn``: a token was drawn).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Group:
    group_id: str
    meta: dict
    size: int
    t_admit: float
    version: int
    samples: dict = field(default_factory=dict)
    sent: dict = field(default_factory=dict)      # sample -> tokens already reported by poll


def new_group(group_id: str, meta: dict | None, n: int, max_tokens: int, now: float, version: int,
              prefix: list[dict] | None = None) -> Group:
    """A group of ``n`` samples admitted at ``now`` under ``version``, with one record per sample.

    ``prefix`` (partial rollout: a group that ran on a failed instance resumes): per sample, the
    ``token_ids``, ``logprobs`` and ``segments`` generated so far and whether it ``finished``; its
    tokens keep their recorded versions and log-probs (``resumed_at``: where this instance's own
    tokens begin). A sample that finished, or used up ``max_tokens``, is finished at once; the
    group's admission version is the oldest version behind any of its tokens."""
    oldest = [int(p["segments"][0][1]) for p in (prefix or []) if p.get("token_ids") and p.get("segments")]
    g = Group(group_id, dict(meta or {}), n, now, min(oldest + [version]))
    for s in range(n):
        pre = (prefix or [])[s] if prefix and s < len(prefix) else {}
        done_tokens = list(pre.get("token_ids", []))
        rec = {"sample": s, "token_ids": done_tokens, "logprobs": list(pre.get("logprobs", [])),
               "t_first_token": now if done_tokens else None, "t_finish": None,
               "version_first": int(pre["segments"][0][1]) if done_tokens else version,
               "segments": [list(x) for x in pre.get("segments", [])] if done_tokens else [], "steps": 0,
               "resumed_at": len(done_tokens), "_drawn": bool(done_tokens)}
        g.samples[s] = rec
        g.sent[s] = len(done_tokens)
        if pre.get("finished") or len(done_tokens) >= max_tokens:
            rec["t_finish"], rec["version_last"] = now, int(rec["segments"][-1][1]) if done_tokens else version
            rec["finish_reason"] = pre.get("finish_reason") or "length"
    return g


def record_output(rec: dict, out: Any, now: float, step_version: int, labels: bool) -> int:
    """Fold one request's output of an engine step (vLLM's ``RequestOutput``, delta kind) into its
    sample's record ``rec``, drawn under ``step_version``; returns the tokens it drew. When the
    request finished and ``labels`` (the engine core labels its steps), the core's label spans of
    the request's tokens (``weight_versions``) replace the segments this instance's clock gave
    them (a resumed sample's kept prefix comes first)."""
    comp = out.outputs[0]
    toks = list(comp.token_ids)
    if toks and rec["t_first_token"] is None:
        rec["t_first_token"] = now
    if toks:
        rec["steps"] += 1
        if not rec["segments"] or rec["segments"][-1][1] != step_version:
            rec["segments"].append([len(rec["token_ids"]), step_version])
    rec["token_ids"].extend(toks)
    if comp.logprobs:
        rec["logprobs"].extend(float(lp[t].logprob) for lp, t in zip(comp.logprobs, toks))
    if toks:
        if not rec.get("_drawn"):
            rec["version_first"], rec["_drawn"] = step_version, True
        rec["version_last"] = step_version
    if getattr(out, "num_cached_tokens", None):  # vLLM's prefix-cache hit for this request
        rec["cached_tokens"] = int(out.num_cached_tokens)
    if out.finished:
        rec["t_finish"] = now
        rec.setdefault("version_last", rec["version_first"])
        spans = getattr(comp, "weight_versions", None) if labels else None
        if spans:
            at = rec["resumed_at"]
            kept = [x for x in rec["segments"] if x[0] < at]
            seg = kept + [[at + int(sp.start), int(sp.version)] for sp in spans]
            rec["segments"] = [x for i, x in enumerate(seg) if i == 0 or x[1] != seg[i - 1][1]]
            rec["version_first"] = int(rec["segments"][0][1])
            rec["version_last"] = int(spans[-1].version)
        rec["finish_reason"] = comp.finish_reason
        rec.pop("_drawn", None)
        if rec["t_first_token"] is None:
            rec["t_first_token"] = now
    return len(toks)


def group_done(g: Group) -> bool:
    return all(x["t_finish"] is not None for x in g.samples.values())


def finished_group(g: Group, instance: int, speculative_tokens: int) -> dict:
    """What a poll hands on for a finished group: its meta, instance, admission version and time,
    and its sample records in sample order."""
    return {"group_id": g.group_id, "meta": g.meta, "instance": instance, "admission_version": g.version,
            "t_admit": g.t_admit, "speculative_tokens": int(speculative_tokens),
            "samples": [g.samples[i] for i in range(g.size)]}


def progress(groups: Any) -> list[dict]:
    """Per running group (``groups``: the instance's :class:`Group` objects) with a prompt id:
    ``key`` (its meta's epoch and prompt id), ``finished`` (sample -> length), ``tokens`` (tokens
    so far of each unfinished sample) and ``new`` (sample -> [token ids, log-probs, segments,
    finish reason or None]: what it drew since the last call, so the caller holds every sample's
    prefix should the instance fail). Marks what it reports in each group's ``sent``."""
    out = []
    for g in groups:
        if g.meta.get("eval") or "prompt_id" not in g.meta:
            continue
        new = {}
        for s, r in g.samples.items():
            k = g.sent.get(s, 0)
            if k < 0:        # finished and reported
                continue
            if len(r["token_ids"]) > k or r["t_finish"] is not None:
                new[s] = [r["token_ids"][k:], r["logprobs"][k:], r["segments"],
                          (r.get("finish_reason") or "stop") if r["t_finish"] is not None else None]
                g.sent[s] = len(r["token_ids"]) if r["t_finish"] is None else -1
        out.append({"key": [g.meta.get("epoch", 0), g.meta["prompt_id"]],
                    "finished": {s: len(r["token_ids"]) for s, r in g.samples.items() if r["t_finish"] is not None},
                    "tokens": [len(r["token_ids"]) for r in g.samples.values() if r["t_finish"] is None],
                    "new": new})
    return out
