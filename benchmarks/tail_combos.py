"""bench_tail.py's ``sweep --combos N`` (its docstring documents it): settings changed several at a
time. Each cell is a reproducible random combination of 2-4 of the single changes that ``sweep`` and
``sweep --more`` make one at a time (``combo_pool``), run with sweep's rows and printed in its table,
its label the changes joined by `` + `` (``--combo-only LABEL`` reruns that one combination; robustness
--chain and bound take it too: ``combo_cells``)."""
from __future__ import annotations

import random
from collections import Counter

from tail_common import _cfg
from tail_sweep import cost_changes, custom_costs, sweep, sweep_cells, sweep_more_cells

COMBO_SIZES = (2, 3, 4)    # changes per combination, drawn uniformly
SEP = " + "                # between a combination's changes in its label
MAX_DRAWS = 100000         # draws tried per workload and device count before giving up on N combinations
ONE = (1.0, 1.0, 1.0)


def combo_pool(wl: str, data, prompts: int, D: int) -> list:
    """(label, overrides, decode factors (a, b, c), trainer factor, kind) of every single change of
    ``sweep_cells`` and ``sweep_more_cells`` on workload ``wl`` at ``D`` devices, their bases left out.
    ``kind``: "set" (the overrides), "planned" (costs known to the planner: ``custom_costs`` of the
    combination's own setup, so that 32b x10 is 32b's costs x10) or "unplanned" (planned on the
    setup's costs, executed on the scaled ones: a Mismatch)."""
    costs = {label: (x, t, planned) for label, x, t, planned in cost_changes()}
    out = []
    for label, over, _ in sweep_cells(wl, data, prompts, D)[1:] + sweep_more_cells(wl, D)[1:]:
        if label in costs:
            x, t, planned = costs[label]
            out.append((label, {}, x, t, "planned" if planned else "unplanned"))
        else:
            out.append((label, over, ONE, 1.0, "set"))
    labels = [c[0] for c in out]
    assert len(set(labels)) == len(labels) and not any(SEP in lb for lb in labels), "combo labels must parse"
    return out


def conflict(changes) -> str | None:
    """Why ``changes`` (combo_pool entries) cannot be one cell, None if they can: two set the same
    config key, two are unplanned costs (one Mismatch a run), or two are known costs (each a whole
    custom cost model)."""
    keys = Counter(k for c in changes for k in c[1])
    if any(n > 1 for n in keys.values()):
        return "a config key set twice"
    kinds = Counter(c[4] for c in changes)
    if kinds["unplanned"] > 1:
        return "two unplanned-cost changes"
    if kinds["planned"] > 1:
        return "two known-cost changes"
    return None


def draw_combos(pool: list, n: int, seed: int, wl: str, D: int) -> tuple[list, Counter]:
    """``n`` distinct combinations of 2-4 entries of ``pool`` (each in pool order), drawn with a
    generator seeded by ``seed``, ``wl`` and ``D`` (the same draws on every run), and how many draws
    were skipped, by reason (``conflict`` or drawn before)."""
    rng = random.Random(f"{seed}/{wl}/{D}")
    out, seen, skipped = [], set(), Counter()
    for _ in range(MAX_DRAWS):
        if len(out) == n:
            break
        idx = tuple(sorted(rng.sample(range(len(pool)), rng.choice(COMBO_SIZES))))
        why = "drawn before" if idx in seen else conflict([pool[i] for i in idx])
        if why:
            skipped[why] += 1
            continue
        seen.add(idx)
        out.append([pool[i] for i in idx])
    return out, skipped


def parse_combo(label: str, pool: list) -> list:
    """The pool entries a combination's ``label`` names (its changes joined by `` + ``); ValueError
    naming what does not parse."""
    by = {c[0]: c for c in pool}
    parts = label.split(SEP)
    bad = [p for p in parts if p not in by]
    if bad:
        raise ValueError(f"--combo-only: {', '.join(map(repr, bad))} is not a change of sweep's lists on this "
                         f"workload (labels as sweep, sweep --more or sweep --combos print them, joined by "
                         f"{SEP!r})")
    changes = [by[p] for p in parts]
    why = conflict(changes)
    if len(changes) < 2 or why:
        raise ValueError(f"--combo-only {label!r}: {why or 'one change'}; a combination is 2 or more changes "
                         f"that set no key twice, at most one unplanned and one known cost change")
    return changes


def combo_cell(wl: str, data, prompts: int, D: int, changes: list):
    """(label, overrides as a function, Mismatch or None): sweep's cell of a combination. The overrides
    are the changes' own, then, with a known-cost change, ``custom_costs`` of the config they make
    (that raises a refused config's ConfigError, which sweep reports as the cell's finding); the
    ``sim.*`` keys only a model class reads (``CLASS_SIM_KEYS``, e.g. the weight sync's bandwidth) are
    then left out: the custom costs already price them, and the config refuses them beside
    ``sim.model_class: custom``."""
    from asp_ascend.config.explicit import CLASS_SIM_KEYS
    from asp_ascend.sim.run import Mismatch

    over = {k: v for c in changes for k, v in c[1].items()}
    mm = next((Mismatch(*c[2]) for c in changes if c[4] == "unplanned"), None)
    known = next((c for c in changes if c[4] == "planned"), None)

    def overrides():
        if known is None:
            return over
        costs = custom_costs(_cfg(wl, data, prompts, D, over), known[2], known[3])
        return {**{k: v for k, v in over.items() if not (k.startswith("sim.") and k[4:] in CLASS_SIM_KEYS)}, **costs}
    return SEP.join(c[0] for c in changes), overrides, mm


def checked_combo(args) -> None:
    """SystemExit naming the workload and device count where ``args.combo_only`` does not parse, before
    anything runs (every workload's pool must name it)."""
    for D in args.devices:
        for wl in args.workloads:
            try:
                parse_combo(args.combo_only, combo_pool(wl, args.data, args.prompts, D))
            except ValueError as e:
                raise SystemExit(f"bench_tail.py {args.what}: {e} (workload {wl}, {D} devices)") from None


def combo_cells(args, workloads_outer: bool = False):
    """(devices, workload, label, run, true cost) of the combination ``args.combo_only`` on every
    --devices and --workloads (device counts outer unless ``workloads_outer``), run as sweep runs its
    cell (``sweep_run``: the workload built from the cell, the row's overrides, then --set, then the
    combination's): ``run(policy, overrides, seed)`` -> (SimResult, config), ``true cost(result)``
    the instances' true cost model (the unplanned-cost change's Mismatch; None: the planned ones).
    For ``robustness --chain`` and ``bound``, whose floors are priced on the true costs; a config the
    combination makes that the check refuses is a SystemExit naming it."""
    from asp_ascend.errors import ConfigError
    from tail_common import set_overrides
    from tail_sweep import sweep_run

    checked_combo(args)
    extra = set_overrides(args.set)
    cells = ([(D, wl) for wl in args.workloads for D in args.devices] if workloads_outer
             else [(D, wl) for D in args.devices for wl in args.workloads])
    for D, wl in cells:
        label, over, mm = combo_cell(wl, args.data, args.prompts, D,
                                     parse_combo(args.combo_only, combo_pool(wl, args.data, args.prompts, D)))
        try:
            over_ = over()
        except ConfigError as e:
            raise SystemExit(f"bench_tail.py {args.what} --combo-only {label!r}: the config it makes on {wl} at {D} "
                             f"devices is refused: {'; '.join(e.problems)}") from None
        run = sweep_run(wl, args.data, args.prompts, D, over_, mm, extra)

        def sim(name, o, s, run=run):
            return run(name, o, s, result=True)

        def cost(res, mm=mm):
            return mm.cost(res.costs.instance) if mm is not None else None
        yield D, wl, label, sim, cost


def combo_sweep(args) -> None:
    """sweep's table on ``args.combos`` combinations per workload and device count (or the one
    ``args.combo_only`` names), then the draws skipped."""
    notes = []
    if args.combo_only:
        checked_combo(args)
    print(f"sweep --combos {args.combos} --combo-seed {args.combo_seed}: each cell 2-4 changes of sweep's two lists "
          f"together, drawn per workload and device count; rerun one with --combo-only 'LABEL'" if not args.combo_only
          else f"sweep --combo-only {args.combo_only!r}")

    def cells_of(wl, D):
        pool = combo_pool(wl, args.data, args.prompts, D)
        if args.combo_only:
            combos = [parse_combo(args.combo_only, pool)]
        else:
            combos, skipped = draw_combos(pool, args.combos, args.combo_seed, wl, D)
            notes.append(f"{wl} / {D}: {len(combos)} combinations of {len(pool)} changes; draws skipped: "
                         + (", ".join(f"{why} {n}" for why, n in sorted(skipped.items())) or "none"))
        return [combo_cell(wl, args.data, args.prompts, D, c) for c in combos]
    sweep(args, cells_of)
    for line in notes:
        print(line)
