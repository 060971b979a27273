"""A CPU stand-in for MindSpeed-RL's TransferDock and DataStrategy, faithful where the async loop can tell.

MindSpeed-RL's workers write their results into the dock fire-and-forget
(``collect_transfer_dock_data`` without ``sync``, ``compute_advantage``): a worker-group call can
return while its rows are still on the way. Readers that go through ``get_experience`` wait
(``_wait_for_data``); a snapshot (``get_experience_data``) does not. Here an unwaited write stays
pending until a waiting read needs its rows, so code that reads a snapshot after such a write
sees ``None`` rows every time (in MindSpeed-RL: intermittently), and code that waits never does.
Timing-free: nothing sleeps.

``get_experience`` returns the batch padded as MindSpeed-RL's ``padding_dict_to_tensor_dict``
does (rows stacked, ``original_length`` per column and row); :func:`unpad` undoes it as
``remove_padding_tensor_dict_to_dict`` does. Calls look like Ray's (``td.get_experience.remote``)
and resolve with :func:`resolve` in place of ``ray.get``.
"""
from __future__ import annotations

import torch

COLUMNS = ("prompts", "prompt_length", "responses", "response_length", "attention_mask", "labels", "input_ids",
           "input_ids_length", "actor_rollout", "rm_scores", "token_level_rewards", "old_log_prob", "ref_log_prob",
           "advantages", "returns")


def pad(columns: dict[str, list]) -> dict:
    out, lengths = {}, []
    for col, rows in columns.items():
        width = max(len(r) for r in rows)
        out[col] = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])
        lengths.extend(torch.tensor(len(r)) for r in rows)
    out["original_length"] = torch.stack(lengths)
    return out


def unpad(batch: dict) -> dict[str, list]:
    lengths = batch["original_length"]
    cols = [c for c in batch if c != "original_length"]
    out = {}
    for k, col in enumerate(cols):
        n = len(batch[col])
        out[col] = [batch[col][i][:int(lengths[k * n + i])] for i in range(n)]
    return out


def resolve(value):
    """``ray.get`` for the stand-in's calls (they return values, not references)."""
    return value


class TransferDock:
    def __init__(self, prompts_num: int, n_samples_per_prompt: int, addition_columns=()):
        self.max_len = prompts_num * n_samples_per_prompt
        self.columns = list(dict.fromkeys([*COLUMNS, *addition_columns]))
        self.pending: list[tuple[dict, list[int]]] = []
        self.clears = 0
        self._reset()

    def _reset(self):
        self.data = {c: [None] * self.max_len for c in self.columns}
        self.consumed: dict[str, set] = {}

    def _apply(self, data_dict: dict, indexes: list[int]) -> None:
        for col, rows in data_dict.items():
            if col not in self.data:
                raise ValueError(f"put experience: {col} not in the dock's columns {self.columns}")
            if len(rows) != len(indexes):
                raise ValueError(f"column {col}: {len(rows)} values for {len(indexes)} rows")
            for i, v in zip(indexes, rows):
                self.data[col][i] = v

    # -- what workers do: results sent without waiting for the dock
    def put_unwaited(self, data_dict: dict, indexes: list[int]) -> None:
        self.pending.append((dict(data_dict), list(indexes)))

    # -- the actor's methods
    def put_experience(self, data_dict, indexes=None, is_prompt=False):
        if not indexes:
            raise ValueError("put experience into TD without indexes, indexes must be provided")
        self._apply(data_dict, list(indexes))

    def get_experience(self, consumer, experience_columns, experience_count=None, dp_size=1, indexes=None,
                       get_n_samples=True, **_):
        if indexes is None:
            raise NotImplementedError("the stand-in serves reads of explicit rows (guarantee_order)")
        self._wait(experience_columns, indexes)
        self.consumed.setdefault(consumer, set()).update(indexes)
        return pad({c: [self.data[c][i] for i in indexes] for c in experience_columns}), list(indexes)

    def _wait(self, columns, indexes) -> None:
        """The dock's wait: every write in flight to these rows lands before the read returns."""
        want = set(indexes)
        still = []
        for data, rows in self.pending:
            if want & set(rows) and set(data) & set(columns):
                self._apply(data, rows)
            else:
                still.append((data, rows))
        self.pending = still
        missing = [(c, i) for c in columns for i in indexes if self.data[c][i] is None]
        if missing:  # the real dock would wait for ever (and log TIMEOUT)
            raise TimeoutError(f"rows {sorted({i for _, i in missing})[:6]} of {sorted({c for c, _ in missing})} "
                               f"are never written")

    def get_experience_data(self):
        """The snapshot MindSpeed-RL's get_experience_data returns: writes in flight are not in it."""
        return {c: list(v) for c, v in self.data.items()}

    def clear(self, consumer="actor_train"):
        if self.pending:
            raise AssertionError(f"{len(self.pending)} worker write(s) never waited for before clear(): in "
                                 f"MindSpeed-RL they would land in the next iteration's rows")
        self._reset()
        self.clears += 1


class _Call:
    def __init__(self, fn):
        self.remote = fn


class TransferDockHandle:
    """The actor handle: ``handle.get_experience.remote(...)``."""

    def __init__(self, dock: TransferDock):
        self.get_experience = _Call(dock.get_experience)
        self.get_experience_data = _Call(dock.get_experience_data)
        self.put_experience = _Call(dock.put_experience)
        self.clear = _Call(dock.clear)


class DataStrategy:
    """MindSpeed-RL's DataStrategy (strategy ``td``): ``put_main`` and ``clear_main`` wait for the dock."""

    def __init__(self, dock: TransferDock):
        self.dock, self.td = dock, TransferDockHandle(dock)

    def put_experience(self, data_dict, indexes, is_prompt=False):
        resolve(self.td.put_experience.remote(data_dict=data_dict, indexes=indexes, is_prompt=is_prompt))

    def clear_main(self):
        resolve(self.td.clear.remote())
